"""The container part of a job's launch line: ``srun ... <runtime> run [--nv|--rocm]
"${ddl_binds[@]}" IMAGE train ...``, and the check that an image suits the site.

The runtime is the site's (``apptainer`` on JSC; ``singularity`` on LUMI, where
``apptainer`` may not exist), the GPU flag follows the site's accelerator (``--nv`` binds
NVIDIA's driver libraries into the container, ``--rocm`` AMD's). The rendezvous is derived
by the batch script outside the container, where ``scontrol`` exists; Apptainer and
Singularity pass the environment through.

Binds: the job's run directory and data directory are bound into the container at their
own paths (Apptainer binds only $HOME, the cwd, /tmp and a few system paths by default, so
/scratch or /p/project would be invisible inside), plus the site profile's
``container.binds``. Apptainer and Singularity stop with a FATAL error when a bind's source
does not exist, so the batch script binds each path only if it exists on the node and says
which it left out. On LUMI the site profile lists no binds: the
``lumi-aif-singularity-bindings`` module its setup loads sets them (see sites/lumi-g.toml).
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ddl.contract.errors import DdlError, UsageError
from ddl.settings.sites import SiteProfile

GPU_FLAGS = {"cuda": "--nv", "rocm": "--rocm"}
TARGET_LABEL = "ddl.target"  # set by containers/<target>.def: cpu, cuda or rocm


@dataclass(frozen=True)
class HostDir:
    """A host directory the job needs inside the container."""

    word: str  # as the batch script writes it (quoted, or a "$variable")
    path: Path  # absolute; for a word holding a variable, a directory it lies in
    flag: str  # the flag it came from, for messages


def image_for(site: SiteProfile, given: str) -> str:
    """``--container IMAGE``, or with the flag alone (``given == ""``) the site's image."""
    if given:
        return given
    if not site.container.image:
        raise UsageError(f"--container: site {site.name} has no default image "
                         "(container.image in its profile); give --container IMAGE")
    return site.container.image


def _covered(path: Path, binds: list[str]) -> bool:
    """Is ``path`` already visible through one of the site's binds (``SRC`` or
    ``SRC:SRC``; a bind to another destination does not show it at its own path)?"""
    for bind in binds:
        src, _, rest = bind.partition(":")
        dst = rest.split(":")[0] or src
        if src == dst and path.is_relative_to(src):
            return True
    return False


def bind_lines(site: SiteProfile, dirs: list[HostDir]) -> list[str]:
    """Bash that fills the array ``ddl_binds`` with ``-B PATH`` for the job's directories
    and the site's binds, each only if it exists on the node. The run directory (first)
    is created first: it may not exist before the job starts."""
    for d in dirs:
        if "," in str(d.path) or ":" in str(d.path):  # -B splits on both
            raise UsageError(f"{d.flag}: {d.path} cannot be bound into a container; allowed: "
                             "a path without ',' or ':'")
    words = [d.word for d in dirs if not _covered(d.path, site.container.binds)]
    words = list(dict.fromkeys(words + [shlex.quote(b) for b in site.container.binds]))
    if not words:
        return ['mkdir -p "$run_dir"', "ddl_binds=()"]
    return [
        "# Container binds: the run and data directories and the site's binds, each only if",
        "# it exists here (a missing bind source is fatal to Apptainer/Singularity).",
        'mkdir -p "$run_dir"',
        "ddl_binds=()",
        f"for path in {' '.join(words)}; do",
        '  if [ -e "${path%%:*}" ]; then ddl_binds+=(-B "$path"); else',
        '    echo "ddl: note: ${path%%:*} does not exist on $(hostname): not bound into the'
        ' container" >&2',
        "  fi",
        "done",
    ]


def entry(site: SiteProfile, image: str) -> list[str]:
    """Shell words (quoted) that start ``ddl`` inside the image; ``train ...`` follows.
    The binds come from the array that :func:`bind_lines` fills."""
    words = [site.container.runtime, "run"]
    if site.accelerator in GPU_FLAGS:
        words.append(GPU_FLAGS[site.accelerator])
    return words + ['"${ddl_binds[@]}"', shlex.quote(image)]


def read_labels(runtime: str, image: str) -> dict[str, str]:
    """The image's labels as ``<runtime> inspect --labels`` prints them (``key: value``)."""
    try:
        proc = subprocess.run([runtime, "inspect", "--labels", image], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DdlError(f"{Path(runtime).name} inspect failed: {exc}") from None
    if proc.returncode:
        reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise DdlError(f"{Path(runtime).name} inspect failed: {reason}")
    pairs = (line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    return {key.strip(): value.strip() for key, value in pairs}


def check_target(site: SiteProfile, image: str, device: str) -> str | None:
    """Refuse an image built for another accelerator than the site's (a CPU image on LUMI,
    a ROCm image on JSC): UsageError. Returns a note when the target could not be checked
    (no runtime here, an image that is not a local file, no label). ``--device cpu`` makes
    any image acceptable; so does a CPU site (GPU builds of torch run on CPUs)."""
    from ddl.launch.container_build import find_runtime

    if device == "cpu" or site.accelerator == "cpu":
        return None
    unchecked = f"the image's target was not checked against site {site.name}"
    if "://" in image or not Path(image).is_file():
        return f"{image} is not a local image file: {unchecked}"
    try:
        runtime = find_runtime(site.container.runtime)
    except DdlError:
        return f"neither apptainer nor singularity is on PATH here: {unchecked}"
    try:
        target = read_labels(runtime, image).get(TARGET_LABEL)
    except DdlError as exc:
        return f"{exc}: {unchecked}"
    if target is None:
        return f"{image} has no {TARGET_LABEL} label (not built by `ddl container build`): " \
               f"{unchecked}"
    if target != site.accelerator:
        raise UsageError(f"--container: {image} is labelled {TARGET_LABEL}={target}, but site "
                         f"{site.name} needs a {site.accelerator} image; allowed: an image "
                         f"built with `ddl container build --target {site.accelerator}`, or "
                         "--device cpu")
    return None
