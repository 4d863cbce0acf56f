"""Site profiles: the facts about one system (accelerators, collectives, launcher, defaults),
kept as validated TOML in ``sites/``.

Profiles are found, in this order (a later directory does not override an earlier one):
1. directories in ``$DDL_SITE_PATH`` (``os.pathsep``-separated);
2. directories returned by plugins' ``ddl_site_dirs`` hook;
3. the profiles shipped with ddl (``sites/`` of the checkout, or ``ddl/_sites`` in a wheel).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ddl.contract.errors import UsageError
from ddl.settings.validation import one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SITE_PATH_ENV = "DDL_SITE_PATH"

# Profile values end up in rendered batch scripts; these keep each where it is written.
SBATCH_WORD = r"^[A-Za-z0-9._:/+@%=,-]+$"  # an #SBATCH line cannot be quoted (see ddl.launch.submit)
ONE_LINE = r"^[^\x00-\x1f\x7f]*$"  # no newline may end a script comment early
SHELL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
IN_DOUBLE_QUOTES = r'^[^"\\`\x00-\x1f\x7f]*$'  # `export K="V"`: $VARS expand, nothing ends it


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Detect(_Strict):
    """How ``--site auto`` recognises the system; a profile matches if any rule matches."""

    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables that must all have these "
        "values (e.g. SYSTEMNAME = 'juwelsbooster')")
    hostnames: list[str] = Field(
        default_factory=list, description="shell-style patterns for the host name (fnmatch)")


class Partition(_Strict):
    gpus_per_node: int = Field(ge=0)
    cpus_per_node: int = Field(ge=1, description="CPU cores (or hardware threads) per node "
                               "that a job may use")
    max_nodes: int | None = Field(None, ge=1)
    max_time: str | None = Field(None, description="wall-clock limit, Slurm format")
    dev: bool = Field(False, description="a small, quick-start development partition")
    whole_nodes: bool = Field(False, description="the site allocates and bills whole nodes "
                              "here (LUMI's standard-g): a job asking for fewer GPUs still "
                              "gets, and pays for, all of the node")
    placeholder: bool = Field(False, description="the name is ddl's stand-in: the site's "
                              "real partition name is not known. `ddl submit` writes no "
                              "--partition line (Slurm's default partition takes the job); "
                              "give the real one with --sbatch=--partition=NAME")

    def cpus_for(self, gpus: int) -> int:
        """CPUs that go with ``gpus`` of this node's GPUs: the node's CPUs per GPU times
        ``gpus`` (LUMI: 7 per GCD; CTE-POWER: 40 per V100), the whole node for all of its
        GPUs or none (a CPU-only job)."""
        if not gpus or not self.gpus_per_node or gpus >= self.gpus_per_node:
            return self.cpus_per_node
        return max(self.cpus_per_node * gpus // self.gpus_per_node, 1)


class Rendezvous(_Strict):
    """Where the ranks meet: the first node of the allocation, as the site names it."""

    host_suffix: str = Field("", pattern=r"^[A-Za-z0-9._-]*$", description="appended to the "
                             "first node's name: 'i' on JSC, '-ib0' on CTE-POWER, '' on LUMI")
    resolve_ip: bool = Field(False, description="pass the rendezvous host as an IP address "
                             "(resolved inside the job)")
    port: int = Field(29500, ge=1, le=65535, description="fixed port, or the prefix "
                      "digit(s) when port_from_job_id")
    port_from_job_id: bool = Field(False, description="port = str(port) + the last four "
                                   "digits of SLURM_JOB_ID (LUMI's rule: port 1 -> 1xxxx)")

    @model_validator(mode="after")
    def _port_range(self) -> Rendezvous:
        if self.port_from_job_id and not 1 <= self.port <= 5:
            raise ValueError("with port_from_job_id the port is a prefix digit 1-5 "
                             "(ports end at 65535)")
        if not self.port_from_job_id and self.port < 1024:
            raise ValueError(f"port {self.port} is privileged; use 1024-65535")
        return self


class Slurm(_Strict):
    gpu_request: Literal["gres", "gpus-per-node", "none"] = Field(
        "gres", description="'gres': --gres=gpu:N; 'gpus-per-node': --gpus-per-node=N")
    mem: str | None = Field(None, pattern=SBATCH_WORD,
                            description="--mem for torchrun-style jobs (whole node)")
    mem_per_gpu: str | None = Field(None, pattern=SBATCH_WORD,
                                    description="--mem-per-gpu for srun-style jobs")
    exclusive: bool = False
    account_required: bool = Field(False, description="the site's sbatch refuses a job "
                                   "without --account (JSC): `ddl submit` says so when none "
                                   "is given")
    extra: list[Annotated[str, Field(pattern=SBATCH_WORD)]] = Field(
        default_factory=list, description="more #SBATCH options")


class CpuBinding(_Strict):
    """CPU binding for one process per GPU.

    ``srun`` is passed as ``srun --cpu-bind=...`` when srun starts one process per GPU.
    Under a per-node launcher srun can bind only the launcher, so the workers bind
    themselves to ``worker_cores[LOCAL_RANK]`` (empty: no binding).
    """

    srun: str = Field("none", pattern=r"^[A-Za-z0-9_:,]*$")
    worker_cores: list[list[int]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _cpu_lists(self) -> CpuBinding:
        kind, _, items = self.srun.partition(":")
        if kind in ("mask_cpu", "map_cpu"):
            for item in items.split(","):
                try:
                    _cpus_of(kind, item)
                except ValueError:
                    raise ValueError(f"{kind} entry {item!r} is not a CPU "
                                     f"{'mask (hex)' if kind == 'mask_cpu' else 'number'}"
                                     ) from None
        return self

    def srun_cpus(self, local_rank: int) -> set[int] | None:
        """The CPUs ``srun --cpu-bind=<srun>`` gives local rank ``local_rank`` (the list
        reused from its start when there are more ranks, as srun does); None when the
        binding names no CPUs (``none``, ``cores``, ...)."""
        kind, _, items = self.srun.partition(":")
        if kind not in ("mask_cpu", "map_cpu"):
            return None
        entries = items.split(",")
        return _cpus_of(kind, entries[local_rank % len(entries)])


def _cpus_of(kind: str, item: str) -> set[int]:
    """One srun mask_cpu entry (hex, 0x optional) or map_cpu entry (decimal, or 0x hex)."""
    if kind == "mask_cpu":
        mask = int(item, 16)
        cpus = {cpu for cpu in range(mask.bit_length()) if mask >> cpu & 1}
    else:
        cpus = {int(item, 16) if item.lower().startswith("0x") else int(item)}
    if not cpus:
        raise ValueError("no CPU")
    return cpus


class Container(_Strict):
    runtime: Literal["apptainer", "singularity"] = "apptainer"
    image: str | None = None
    binds: list[str] = Field(default_factory=list)


class SiteDefaults(_Strict):
    """Run settings a site supplies unless the config file or a flag says otherwise."""

    nproc: int | None = Field(None, ge=1, description="processes per node for local launches")
    data_dir: str | None = Field(None, description="where datasets live (relative: to the cwd)")
    workers: int | None = Field(None, ge=0, description="DataLoader workers per process")
    synthetic_if_missing: bool = Field(
        False, description="generate synthetic data when the default data dir is empty "
        "(laptops and CI only; clusters must say which `ddl prepare` to run)")


SITE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class SiteProfile(_Strict):
    name: str = Field(pattern=SITE_NAME)
    aliases: list[Annotated[str, Field(pattern=SITE_NAME)]] = Field(
        default_factory=list, description="short names `--site` also accepts (e.g. 'lumi' "
        "for lumi-g); a name that is a profile's file name always means that profile")
    description: str = Field(pattern=ONE_LINE)
    detect: Detect = Detect()
    accelerator: Literal["cpu", "cuda", "rocm"]
    arch: Literal["x86_64", "aarch64", "ppc64le"] | None = Field(
        None, description="CPU architecture of the compute nodes (`uname -m`); images and "
        "torch builds must be made for it. None: not checked")
    torch_source: str = Field("", pattern=ONE_LINE, description="where a torch build for "
                              "this site comes from, said when a node does not fit")
    device_peak_flops: float | None = Field(
        None, gt=0, description="dense peak of ONE device as torch sees it (an MI250X GCD, "
        "not the module), in FLOP/s, for MFU")
    device_memory_bytes: int | None = Field(
        None, gt=0, description="memory of ONE device as torch sees it (an MI250X GCD: "
        "64 GiB), for `ddl plan`'s fit check")
    intra_node_bytes_per_s: float | None = Field(
        None, gt=0, description="one device's bandwidth to its node's other devices "
        "(NVLink, Infinity Fabric), one direction, for `ddl plan`'s step-time estimate")
    inter_node_bytes_per_s: float | None = Field(
        None, gt=0, description="one node's network injection bandwidth (all its NICs), one "
        "direction, for `ddl plan`'s step-time estimate")
    intra_node_latency_s: float | None = Field(
        None, gt=0, description="latency of one message between two devices of a node (one "
        "step of a ring collective: alpha), in seconds, for `ddl plan`'s step-time estimate")
    inter_node_latency_s: float | None = Field(
        None, gt=0, description="latency of one message between two nodes (one ring step "
        "across the network: alpha), in seconds, for `ddl plan`'s step-time estimate")
    backend: Literal["gloo", "nccl"] = Field(
        description="torch.distributed backend; 'nccl' also means RCCL on ROCm builds")
    launcher: Literal["local", "srun", "torchrun", "torchrun_jsc"] = Field(
        "local", description="'local': torch's elastic agent on this host; 'srun': one "
        "process per GPU started by srun; 'torchrun'/'torchrun_jsc': one launcher per node")
    partitions: dict[str, Partition] = Field(default_factory=dict)
    default_partition: str | None = None
    rendezvous: Rendezvous = Rendezvous()
    slurm: Slurm = Slurm()
    cpu_binding: CpuBinding = CpuBinding()
    env: dict[Annotated[str, Field(pattern=SHELL_NAME)],
              Annotated[str, Field(pattern=IN_DOUBLE_QUOTES)]] = Field(
        default_factory=dict, description="exported in every job; values may use "
        "${SLURM_...} variables of the job")
    setup: list[str] = Field(default_factory=list, description="shell lines run before the "
                             "launch in a job (module loads, venv activation)")
    container: Container = Container()
    offline: bool = Field(False, description="compute nodes have no internet: set the HF "
                          "offline variables and never download at train time")
    unverified: dict[str, str] = Field(default_factory=dict, description="keys whose values "
                                       "are general knowledge, not read in a source: key -> note")
    defaults: SiteDefaults = SiteDefaults()
    source: str = Field("", exclude=True, description="file the profile was read from")

    @model_validator(mode="after")
    def _partitions_consistent(self) -> SiteProfile:
        if self.default_partition and self.default_partition not in self.partitions:
            raise ValueError(f"default_partition {self.default_partition!r} is not one of "
                             f"the partitions ({', '.join(self.partitions) or 'none'})")
        if self.partitions and not self.default_partition:
            raise ValueError("default_partition is required when partitions are given")
        if self.launcher != "local" and not self.partitions:
            raise ValueError(f"launcher {self.launcher!r} needs at least one partition")
        return self

    @property
    def uses_slurm(self) -> bool:
        return self.launcher != "local"

    def partition(self, name: str | None) -> tuple[str, Partition]:
        chosen = name or self.default_partition
        if chosen not in self.partitions:
            shown = repr(chosen) if len(str(chosen)) <= 40 else f"{chosen[:40]!r}..."
            raise UsageError(f"--partition: {self.name} has no partition {shown}; allowed: "
                             f"{', '.join(self.partitions) or 'none (not a Slurm site)'}")
        return chosen, self.partitions[chosen]


def _builtin_dir() -> Path:
    packaged = Path(__file__).parents[1] / "_sites"  # ddl/_sites in a wheel
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[5] / "sites"  # editable install in a checkout


def site_dirs(plugins=None) -> list[Path]:
    dirs = [Path(p) for p in os.environ.get(SITE_PATH_ENV, "").split(os.pathsep) if p]
    if plugins is not None:
        dirs += [Path(d) for d in plugins.site_dirs()]
    dirs.append(_builtin_dir())
    return dirs


def _profile_files(plugins=None) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in site_dirs(plugins):
        for path in sorted(directory.glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def load_profile(path: Path) -> SiteProfile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))  # TOML is UTF-8 by definition
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not a readable TOML file: {exc}") from None
    try:
        profile = SiteProfile.model_validate({**data, "source": str(path)})
    except ValidationError as exc:
        raise UsageError(one_line(exc, SiteProfile, where=str(path), key_style="key")) from None
    if profile.name != path.stem:
        raise UsageError(f"{path}: name {profile.name!r} must match the file name {path.stem!r}")
    return profile


def known_sites(plugins=None) -> dict[str, Path]:
    return _profile_files(plugins)


def aliases(plugins=None) -> dict[str, str]:
    """alias -> profile name, over every readable profile. A profile that fails to load is
    left out here (``ddl sites`` reports it); an alias that is also a profile's own name, or
    that two profiles claim, is ignored: the first profile found (site_dirs order) keeps it,
    as with profile files themselves."""
    files = _profile_files(plugins)
    found: dict[str, str] = {}
    for name, path in files.items():
        try:
            profile = load_profile(path)
        except UsageError:
            continue
        for alias in profile.aliases:
            if alias not in files:
                found.setdefault(alias, name)
    return found


def resolve_name(name: str, plugins=None) -> str:
    """The profile a ``--site`` value means: its own name, or the profile that lists it as an
    alias (``lumi`` -> ``lumi-g``)."""
    files = _profile_files(plugins)
    if name in files:
        return name
    short = aliases(plugins)
    if name in short:
        return short[name]
    allowed = sorted([*files, *(f"{a} (= {p})" for a, p in short.items())])
    shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}..."
    raise UsageError(f"--site: unknown site {shown}; allowed: {', '.join(allowed)}")


def get_site(name: str, plugins=None) -> SiteProfile:
    """The profile called ``name`` (or listing ``name`` among its aliases)."""
    return load_profile(_profile_files(plugins)[resolve_name(name, plugins)])


def detect_site(plugins=None, env=None, hostname: str | None = None) -> tuple[str, str]:
    """The name of the profile whose ``detect`` rules match this machine, and why."""
    profile, why = detect_profile(plugins, env, hostname)
    return profile.name, why


def detect_profile(plugins=None, env=None,
                   hostname: str | None = None) -> tuple[SiteProfile, str]:
    """Pick the profile whose ``detect`` rules match this machine: (profile, why).

    Environment rules are checked before hostname patterns across all profiles, since a
    variable such as SYSTEMNAME is the more specific signal. Nothing matching: ``local``.
    Each profile is read once (the one returned is not read again).
    """
    import fnmatch
    import socket

    env = os.environ if env is None else env
    hostname = hostname or socket.gethostname()
    profiles = [load_profile(path) for path in _profile_files(plugins).values()]
    for profile in profiles:
        rules = profile.detect.env
        if rules and all(env.get(k) == v for k, v in rules.items()):
            why = ", ".join(f"{k}={v}" for k, v in rules.items())
            return profile, f"environment {why}"
    for profile in profiles:
        for pattern in profile.detect.hostnames:
            if fnmatch.fnmatch(hostname, pattern):
                return profile, f"hostname {hostname} matches {pattern!r}"
    local = next((p for p in profiles if p.name == "local"), None) or get_site("local", plugins)
    return local, "no site profile matches this machine"
