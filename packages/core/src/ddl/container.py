"""``ddl container build`` and ``ddl container check``: a thin wrapper over the real
``apptainer build`` (or ``singularity build`` where that is the command, as on LUMI).

The wrapper only assembles what the definition files in ``containers/`` expect: the
wheelhouse with ddl's wheels (scripts/build-wheelhouse.sh makes it), the base image as the
``BOOTSTRAP``/``FROM`` build arguments (so one definition serves a registry image and a
local directory alike), and labels for the commit and build date. It checks the
definition first (ddl.container_def), then runs the build with its output streamed, and
when the build fails it repeats the runtime's own FATAL line as the error.
"""

from __future__ import annotations

import datetime
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddl.container_def import check as check_definition
from ddl.container_def import parse as parse_definition
from ddl.errors import DdlError, UsageError

TARGETS = ("cpu", "cuda", "rocm")
RUNTIMES = ("apptainer", "singularity")
BASE_SCHEMES = ("docker", "library", "oras", "shub")
# Uncompressed squashfs: mksquashfs with gzip managed only a few MB/s on 2 cores, and the
# CPU image is several GB (the image is about twice the size instead).
NO_COMPRESS = "-noI -noD -noF -noX"


def checkout_root() -> Path | None:
    """The ddl checkout this package runs from (an editable install), if any."""
    root = Path(__file__).resolve().parents[4]
    return root if (root / "containers").is_dir() and (root / "packages").is_dir() else None


def find_runtime(prefer: str | None = None) -> str:
    """Path of ``apptainer`` or else ``singularity`` (``prefer`` first)."""
    order = (prefer, *[r for r in RUNTIMES if r != prefer]) if prefer else RUNTIMES
    for name in order:
        found = shutil.which(name)
        if found:
            return found
    raise DdlError("neither apptainer nor singularity is on PATH: install Apptainer "
                   "(apptainer.org) or load the site's module; `ddl container check` works "
                   "without either")


def definition_for(target: str) -> Path:
    root = checkout_root()
    if root is None:
        raise UsageError(f"--target {target}: containers/{target}.def is part of the ddl "
                         "checkout; run from a checkout or give --def PATH")
    return root / "containers" / f"{target}.def"


def base_arguments(base: str) -> dict[str, str]:
    """``--base`` as build arguments: a local image file or directory -> localimage; a
    ``scheme://ref`` -> that bootstrap agent."""
    scheme, sep, ref = base.partition("://")
    if sep:
        if scheme not in BASE_SCHEMES or not ref:
            raise UsageError(f"--base: {base!r} has an unknown scheme; allowed: an existing "
                             "local image or directory, or " +
                             ", ".join(f"{s}://REF" for s in BASE_SCHEMES))
        return {"BOOTSTRAP": scheme, "FROM": ref}
    path = Path(base)
    if not path.exists():
        raise UsageError(f"--base: {base} does not exist; allowed: an existing local image "
                         "or directory, or " + ", ".join(f"{s}://REF" for s in BASE_SCHEMES))
    return {"BOOTSTRAP": "localimage", "FROM": str(path.resolve())}


def check_wheelhouse(wheelhouse: Path) -> None:
    if not any(wheelhouse.glob("ddl-*.whl")):
        raise UsageError(f"--wheelhouse: no ddl wheel in {wheelhouse}; make one with "
                         f"`scripts/build-wheelhouse.sh {wheelhouse}` (add --torch for the "
                         "CPU image, --offline for a build without a package index)")
    root = checkout_root()
    if root is None:
        return
    wheel_time = min(p.stat().st_mtime for p in wheelhouse.glob("ddl*.whl"))
    sources = [*root.glob("packages/**/*.py"), *root.glob("packages/*/pyproject.toml"),
               *root.glob("packages/plugins/*/pyproject.toml"), *root.glob("sites/*.toml")]
    newer = [p for p in sources if p.stat().st_mtime > wheel_time]
    if newer:
        print(f"ddl: note: {len(newer)} source file(s) changed after the wheels in "
              f"{wheelhouse} were built (e.g. {newer[0].relative_to(root)}); rerun "
              "scripts/build-wheelhouse.sh to put them in the image", file=sys.stderr)


def commit_label() -> str:
    root = checkout_root()
    if root is None or not (root / ".git").exists():
        return "unknown"
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


@dataclass
class BuildRequest:
    definition: Path
    output: Path
    wheelhouse: Path
    base: str | None = None
    offline: bool = False
    build_args: dict[str, str] = field(default_factory=dict)  # the user's, win over ours
    force: bool = False
    no_compress: bool = False
    fakeroot: bool = False


def build_arguments(req: BuildRequest) -> dict[str, str]:
    args = {"WHEELHOUSE": str(req.wheelhouse.resolve()), "DDL_COMMIT": commit_label(),
            "BUILD_DATE": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ")}
    if req.offline:
        args["PIP_OPTIONS"] = "--no-index"
    if req.base:
        args.update(base_arguments(req.base))
    args.update(req.build_args)
    return args


def validate(req: BuildRequest, check: bool = True) -> dict[str, str]:
    """Check the definition and its inputs; return the build arguments to pass. Without
    ``check`` the definition is only read (the runtime's own parser still runs)."""
    if not req.definition.is_file():
        raise UsageError(f"--def: {req.definition} is not a file")
    args = build_arguments(req)
    try:
        stages = parse_definition(req.definition)
    except UsageError:
        if check:
            raise
        return args  # the runtime will say what is wrong
    used = {name for stage in stages for name in stage.used}
    if "WHEELHOUSE" in used:
        check_wheelhouse(req.wheelhouse)
    if check:
        check_definition(req.definition, args)
    # Only arguments the definition uses (apptainer warns about the others), but every
    # one the user gave.
    return {k: v for k, v in args.items() if k in used or k in req.build_args}


def prepare(req: BuildRequest, runtime: str, check: bool = True) -> list[str]:
    """Check everything a build needs and return the command that runs it."""
    if req.output.exists() and not req.force:
        raise UsageError(f"--output: {req.output} exists; pass --force to replace it")
    if not req.output.parent.is_dir():
        raise UsageError(f"--output: directory {req.output.parent} does not exist")
    args = validate(req, check)
    cmd = [runtime, "build"]
    if req.force:
        cmd.append("--force")
    if req.fakeroot:
        cmd.append("--fakeroot")
    if req.no_compress:
        cmd += ["--mksquashfs-args", NO_COMPRESS]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    return cmd + [str(req.output), str(req.definition)]


def run_build(cmd: list[str]) -> None:
    """Run the build with its output shown as it comes; a failure ends with the runtime's
    own error line."""
    print("ddl: " + shlex.join(cmd), file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        raise DdlError(f"cannot start {cmd[0]}: {exc}") from None
    fatal = first_error = ""
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        if line.startswith("FATAL:"):
            fatal = line.split(":", 1)[1].strip()
        elif line.startswith("ERROR:") and not first_error:  # e.g. pip's, in %post
            first_error = line.strip()
    code = proc.wait()
    if code:
        reason = "; ".join(filter(None, (fatal, first_error))) or "see its output above"
        raise DdlError(f"{Path(cmd[0]).name} build failed (exit {code}): {reason}")
