"""``ddl container build`` and ``ddl container check``: a thin wrapper over the real
``apptainer build`` (or ``singularity build`` where that is the command, as on LUMI).

The wrapper only assembles what the definition files in ``containers/`` expect: the
wheelhouse with ddl's wheels (scripts/build-wheelhouse.sh makes it), the base image as the
``BOOTSTRAP``/``FROM`` build arguments (so one definition serves a registry image and a
local directory alike), and labels for the commit and build date. It checks the
definition first (ddl.launch.container_def), asks the runtime its version and passes only options
that runtime has (`Runtime`), then runs the build with its output streamed; when the build
fails, the one-line error names the failing section and the last meaningful error line of
the build's output (pip's ERROR, a shell's "not found"), not only the runtime's FATAL.

Runtimes: Apptainer (JSC, this machine) or SingularityCE (LUMI's `singularity`, from the
OS). Option support, from their manuals (SingularityCE: `singularity build --help` of 4.1,
manpages.ubuntu.com/manpages/noble/en/man1/singularity-build.1.html; Apptainer:
apptainer.org/docs/user/latest/cli/apptainer_build.html):
- ``--mksquashfs-args``: Apptainer only (SingularityCE has no such option).
- ``--build-arg`` / ``%arguments``: Apptainer >= 1.2, SingularityCE >= 4.0.
- ``--fakeroot`` needs a /etc/subuid mapping (or root); LUMI offers neither, and builds on
  an existing image there go through SingularityCE's unprivileged proot builds, with
  ``proot`` from ``module load systools`` (LUMI: lumi-supercomputer.github.io/
  LUMI-EasyBuild-docs/p/PRoot: "one of the few ways available on LUMI to extend
  containers as user namespaces or fakeroot are not available").
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddl.launch.container_def import check as check_definition
from ddl.launch.container_def import parse as parse_definition
from ddl.contract.errors import DdlError, UsageError
from ddl.launch.wheelhouse import wheelhouse_torch

TARGETS = ("cpu", "cuda", "rocm")
RUNTIMES = ("apptainer", "singularity")
BASE_SCHEMES = ("docker", "library", "oras", "shub")
# Uncompressed squashfs: mksquashfs with gzip managed only a few MB/s on 2 cores, and the
# CPU image is several GB (the image is about twice the size instead).
NO_COMPRESS = "-noI -noD -noF -noX"


def checkout_root() -> Path | None:
    """The ddl checkout this package runs from (an editable install), if any."""
    root = Path(__file__).resolve().parents[5]  # packages/core/src/ddl/launch/
    return root if (root / "containers").is_dir() and (root / "packages").is_dir() else None


@dataclass(frozen=True)
class Runtime:
    """A container runtime as its ``--version`` describes it."""

    path: str
    flavour: str  # "apptainer", "singularity-ce", or "singularity" (pre-split Singularity)
    version: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.flavour} {'.'.join(map(str, self.version))}"

    @property
    def has_mksquashfs_args(self) -> bool:
        return self.flavour == "apptainer"

    @property
    def has_build_args(self) -> bool:
        return (self.flavour == "apptainer" and self.version >= (1, 2)
                or self.flavour == "singularity-ce" and self.version >= (4, 0))


def parse_version(path: str, text: str) -> Runtime:
    """``apptainer version 1.4.5`` / ``singularity-ce version 4.1.1-jammy`` /
    ``singularity version 3.8.7`` (an ``apptainer`` installation's ``singularity`` link
    answers ``apptainer version ...``: the text decides, not the command's name)."""
    found = re.search(r"(apptainer|singularity-ce|singularity)\s+version\s+(\d+(?:\.\d+)*)",
                      text)
    if not found:
        raise DdlError(f"{path} --version said {text.strip()[:80]!r}; expected 'apptainer "
                       "version X' or 'singularity-ce version X'")
    return Runtime(path, found.group(1), tuple(int(n) for n in found.group(2).split(".")))


def detect_runtime(path: str) -> Runtime:
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DdlError(f"cannot run {path} --version: {exc}") from None
    return parse_version(path, proc.stdout + proc.stderr)


def default_output() -> Path:
    """``containers/ddl.sif`` of the checkout ddl runs from (the path the headline command
    `apptainer run containers/ddl.sif ...` uses), else ``./ddl.sif``. One name for every
    target: the image carries its target (label ``ddl.target``, /opt/ddl/target)."""
    root = checkout_root()
    return root / "containers" / "ddl.sif" if root else Path("ddl.sif")


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
                         f"`scripts/build-wheelhouse.sh {wheelhouse}` (add --cpu-torch for the "
                         "CPU image's torch, --offline for a build without a package index)")
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
    no_test: bool = False


@dataclass(frozen=True)
class Host:
    """What decides whether a build may fake root or must use proot."""

    is_root: bool
    has_subuid: bool  # the user has a /etc/subuid range (what --fakeroot needs)
    has_proot: bool

    @classmethod
    def here(cls) -> Host:
        user = os.environ.get("USER") or str(os.getuid())
        try:
            subuid = Path("/etc/subuid").read_text()
        except OSError:
            subuid = ""
        mapped = any(line.split(":")[0] in (user, str(os.getuid()))
                     for line in subuid.splitlines() if line.strip())
        return cls(os.geteuid() == 0, mapped, shutil.which("proot") is not None)


def build_arguments(req: BuildRequest) -> dict[str, str]:
    args = {"WHEELHOUSE": str(req.wheelhouse.resolve()), "DDL_COMMIT": commit_label(),
            "BUILD_DATE": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ")}
    if req.offline:
        args["PIP_OPTIONS"] = "--no-index"
    if "TORCH" not in req.build_args and req.wheelhouse.is_dir():
        pair = wheelhouse_torch(req.wheelhouse)
        if pair:
            args["TORCH"] = pair  # only passed where the definition uses it (validate)
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


def runtime_options(req: BuildRequest, runtime: Runtime, host: Host,
                    build_args: dict[str, str]) -> list[str]:
    """The options of ``RUNTIME build`` for this request, only those the runtime has;
    a request it cannot honour is refused in one line."""
    options = ["--force"] if req.force else []
    if req.no_test:
        options.append("--notest")  # both runtimes have it
    if req.fakeroot:
        if runtime.flavour != "apptainer" and not (host.is_root or host.has_subuid):
            raise UsageError(f"--fakeroot: {runtime.label} can fake root only for a user with "
                             "a /etc/subuid range, and there is none here (as on LUMI); "
                             "drop --fakeroot: SingularityCE then builds unprivileged with "
                             "proot (LUMI: `module load systools`)")
        options.append("--fakeroot")
    elif runtime.flavour != "apptainer" and not host.is_root and not host.has_proot:
        raise UsageError(f"{runtime.label} builds a definition as a normal user only through "
                         "proot, and proot is not on PATH; allowed: load it (LUMI: `module "
                         "load systools`), or --fakeroot where /etc/subuid maps you")
    if req.no_compress:
        if not runtime.has_mksquashfs_args:
            raise UsageError(f"--no-compress: {runtime.label} has no --mksquashfs-args (an "
                             "Apptainer option); build without --no-compress")
        options += ["--mksquashfs-args", NO_COMPRESS]
    if build_args and not runtime.has_build_args:
        raise UsageError(f"{req.definition} needs build arguments ({', '.join(build_args)}), "
                         f"which {runtime.label} cannot pass; allowed: Apptainer >= 1.2 or "
                         "SingularityCE >= 4.0")
    return options


def prepare(req: BuildRequest, runtime: Runtime | str, check: bool = True,
            host: Host | None = None) -> list[str]:
    """Check everything a build needs and return the command that runs it. A runtime
    given as a bare name (not installed, for --dry-run) is taken to be a current
    Apptainer, or SingularityCE when it is called singularity."""
    if isinstance(runtime, str):
        singularity = Path(runtime).name == "singularity"
        runtime = Runtime(runtime, "singularity-ce" if singularity else "apptainer",
                          (4, 0) if singularity else (1, 4))
    if req.output.exists() and not req.force:
        raise UsageError(f"--output: {req.output} exists; pass --force to replace it")
    if not req.output.parent.is_dir():
        raise UsageError(f"--output: directory {req.output.parent} does not exist")
    args = validate(req, check)
    cmd = [runtime.path, "build", *runtime_options(req, runtime, host or Host.here(), args)]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    return cmd + [str(req.output), str(req.definition)]


def run_build(cmd: list[str], definition: Path | None = None) -> None:
    """Run the build with its output shown as it comes (all of it on stderr); a failure
    ends with one line naming the failing section and the cause found in the output."""
    print("ddl: " + shlex.join(cmd), file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
    except OSError as exc:
        raise DdlError(f"cannot start {cmd[0]}: {exc}") from None
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line.rstrip("\n"))
    code = proc.wait()
    if code:
        raise DdlError(f"{Path(cmd[0]).name} build failed (exit {code}): "
                       + failure_reason(lines, definition))


# Lines the runtime, the shell's trace (set -x) or pip's hints add around a failure.
_NOISE = re.compile(r"^(\+ |INFO:|WARNING:|VERBOSE:|DEBUG:|FATAL:|ERROR: ResolutionImpossible"
                    r"|hint:|note:|\s*$)")
_CAUSE = re.compile(r"^ERROR:|^E: |error|Error|not found|No such file|Permission denied"
                    r"|cannot |can't |[Ff]ailed|Traceback|exit status")


def failure_reason(lines: list[str], definition: Path | None = None) -> str:
    """The failing section and the last meaningful error line before the runtime's FATAL
    (pip's ERROR, "nosuch: not found", ...), with a script's line mapped to the
    definition file's; pip's dependency conflict is given whole ("The conflict is caused
    by: ..."). Falls back to the FATAL line itself."""
    fatal_at = max((i for i, l in enumerate(lines) if l.startswith("FATAL:")), default=None)
    fatal = lines[fatal_at].split(":", 1)[1].strip() if fatal_at is not None else ""
    before = lines[:fatal_at] if fatal_at is not None else lines
    named = re.search(r"running %(\w+) section", fatal)
    ran = [m.group(1) for l in before if (m := re.match(r"INFO:\s+Running (\w+) scriptlet", l))]
    section = "%" + (named.group(1) if named else ran[-1]) if named or ran else None
    cause = _conflict(before) or next(
        (l.strip() for l in reversed(before) if not _NOISE.match(l) and _CAUSE.search(l)), "")
    cause = _map_script_line(cause, section, definition)
    where = f"in {section}: " if section else ""
    return where + (cause or fatal or "see its output above")


def _conflict(lines: list[str]) -> str:
    """pip's ResolutionImpossible explanation, as one line."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip() == "The conflict is caused by:":
            why = []
            for line in lines[i + 1:]:
                if not line.strip():
                    break
                why.append(line.strip())
            head = next((l.strip() for l in reversed(lines[:i]) if l.startswith("ERROR: Cannot")),
                        "pip: conflicting dependencies")
            return f"{head.removeprefix('ERROR: ')} The conflict: {'; '.join(why)}"
    return ""


def _map_script_line(cause: str, section: str | None, definition: Path | None) -> str:
    """``/.post.script: 4: x: not found`` -> ``x.def:12: x: not found`` where the
    definition has exactly one such section."""
    found = re.match(r"/\.(\w+)\.script: (?:line )?(\d+): (.*)", cause)
    if not (found and section and definition):
        return cause
    try:
        starts = [n for stage in parse_definition(definition)
                  for n, name, _ in stage.sections if "%" + name == section]
    except UsageError:
        return cause
    if len(starts) != 1:
        return cause
    return f"{definition}:{starts[0] + int(found.group(2))}: {found.group(3)}"
