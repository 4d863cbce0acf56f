"""ddl running inside an Apptainer or Singularity container: which image, and which paths
outlive it.

Both runtimes set ``APPTAINER_CONTAINER`` / ``SINGULARITY_CONTAINER`` (the image's path on
the host) in the container's environment (Apptainer sets both, SingularityCE the second);
ddl's own images also set ``DDL_CONTAINER_TARGET`` (cpu, cuda or rocm). Outside a container
none of this applies.

Results must outlive the container. Inside one, a path is *kept* when the mount holding it
(the longest mount point of ``/proc/self/mountinfo`` containing it) is a host filesystem
bound in: neither the container's root (mount point ``/``: the image, as an overlay or
squashfs, with any ``--overlay`` or ``--writable-tmpfs`` layer) nor a memory filesystem
(tmpfs, ramfs). ``--containall`` puts ``$HOME`` and ``/tmp`` on the runtime's session
tmpfs, which vanishes when the container exits; a host tmpfs such as ``/dev/shm`` does not
outlive the node's job either. The same directory is thus kept with ``apptainer run`` (cwd
and ``$HOME`` bound) and lost with ``apptainer run --containall``. The filesystem type of a
bound host directory is the host's (ext4, xfs, nfs, gpfs, lustre, or overlay when the host
is itself a container) and does not matter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ddl.contract.errors import UsageError

TARGET_ENV = "DDL_CONTAINER_TARGET"
# (runtime, variable it sets inside); Apptainer also sets SINGULARITY_CONTAINER, so it is
# asked first.
RUNTIME_VARS = (("apptainer", "APPTAINER_CONTAINER"), ("singularity", "SINGULARITY_CONTAINER"))
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}
# An image's own filesystem mounted elsewhere than / (a SIF's data bound in read-only).
IMAGE_FILESYSTEMS = {"squashfs", "fuse.squashfuse", "fuse.squashfuse_ll"}
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class RunningContainer:
    """The container this process runs in (the site profile's container settings are
    ``ddl.settings.sites.Container``)."""

    runtime: str  # "apptainer" or "singularity"
    image: str
    target: str | None  # from DDL_CONTAINER_TARGET; None for images ddl did not build

    def describe(self) -> str:
        return f"inside a container ({self.image}, target {self.target or 'unknown'})"


def detect(environ: dict[str, str] | None = None) -> RunningContainer | None:
    env = os.environ if environ is None else environ
    for runtime, variable in RUNTIME_VARS:
        if env.get(variable):
            return RunningContainer(runtime, env[variable], env.get(TARGET_ENV) or None)
    return None


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """One Mount per line of /proc/self/mountinfo, in the kernel's order (see proc(5):
    the mount point is field 5, the filesystem type follows the ' - ' separator)."""
    mounts = []
    for line in text.splitlines():
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5 or not rest.split():
            continue
        mounts.append(Mount(_unescape(parts[4]), rest.split()[0]))
    return mounts


def mount_of(path: Path, mounts: list[Mount]) -> Mount:
    """The mount a path lives on: the longest mount point containing it; of equal ones the
    last, which is mounted over the others."""
    text = str(path)
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        inside = point == "/" or text == point or text.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = mount
    if best is None:
        raise ValueError(f"no mount holds {path}")
    return best


def why_lost(path: Path, mounts: list[Mount]) -> str | None:
    """Why files under `path` would not outlive the container (None: they would)."""
    mount = mount_of(path, mounts)
    if mount.point == "/" or mount.fstype in IMAGE_FILESYSTEMS:
        return f"in the image's own filesystem ({mount.fstype} at {mount.point})"
    if mount.fstype in MEMORY_FILESYSTEMS:
        return f"on a memory filesystem ({mount.fstype} at {mount.point})"
    return None


def check_kept(path: Path, flag: str, container: RunningContainer | None,
               mountinfo: str | None = None) -> None:
    """Refuse, in one line, a results path that the container would take with it."""
    if container is None:
        return
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return  # cannot tell; the runtime's own binds decide
    absolute = Path(os.path.abspath(path)).resolve()
    reason = why_lost(absolute, parse_mountinfo(mountinfo))
    if reason:
        raise UsageError(
            f"{flag}: {absolute} is {reason} inside the container, so results written there "
            f"are lost when it exits; give a directory on a host filesystem bound into the "
            f"container ({container.runtime} run -B HOST_DIR, or run from a bound directory "
            f"without --containall)")


def missing_dir(path: Path, flag: str, container: RunningContainer, prepare_hint: str) -> str:
    """The message for a directory that does not exist inside the container: it may well
    exist on the host, unbound."""
    absolute = Path(os.path.abspath(path))
    return (f"{flag}: {absolute} does not exist inside the container ({container.image}); "
            f"if it exists on the host, bind it ({container.runtime} run -B {absolute} ...), "
            f"otherwise {prepare_hint}")
