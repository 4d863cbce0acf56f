"""What ``ddl submit`` checks of the run before it writes a script: the mistakes ``ddl
train`` would find only inside the job, after the queue wait, refused here in one line and
without torch (names, preset, strategy options, the layout, paths).

Paths are checked where this machine has their file system: a ``/p/project1/...`` data dir
rendered on a laptop (``--dry-run`` for another system) cannot be looked at, so only paths
whose top directory exists here are (a login node of the site has them all).
"""

from __future__ import annotations

from pathlib import Path

from ddl.contract.errors import UsageError
from ddl.contract.layout import MESH_ALLOWED, MESH_DP_MEANS, MESH_FILL, check_heads, resolve
from ddl.planning import memory_fit
from ddl.settings.config import RunConfig, check_names, preset_name
from ddl.settings import rundir
from ddl.settings.plan import absolute
from ddl.settings.sites import SiteProfile

NAME_MAX, PATH_MAX = rundir.NAME_MAX, rundir.PATH_MAX  # Linux's, in bytes
BELOW_RUN_DIR = 1 + rundir.ROOM_BELOW  # path's NUL, room for what ddl writes below a run dir


def processes_per_node(site: SiteProfile, partition: str | None, gpus: int | None) -> int:
    """The ranks one node of the job runs: its GPUs (the partition's, or --gpus-per-node),
    one process on a CPU-only request."""
    _, part = site.partition(partition)
    return max(part.gpus_per_node if gpus is None else gpus, 1)


def check_run(config: RunConfig, plugins, site: SiteProfile, *, nodes: int,
              partition: str | None, gpus: int | None, data_dir_given: bool,
              force: bool = False) -> list[str]:
    """Every check; the first mistake raises UsageError (one line). ``force``: submit a
    layout predicted not to fit anyway (``--force``). Returns notes worth a line (a layout
    that runs, but not as well as it could)."""
    check_names(config, plugins)  # plugin, strategy, preset
    _strategy_options(config, plugins)
    _gpus(site, config.device, gpus)
    per_node = processes_per_node(site, partition, gpus)
    world = nodes * per_node
    _mesh(config, world)
    spec = plugins.workload(config.plugin)
    name = preset_name(config, spec)
    notes = _tensor_parallel(config, spec.presets[name], world, per_node)
    if not force:
        memory_fit.check(config, spec.presets[name], name, site, world)
    if data_dir_given:  # the default ./data: the job may be submitted from anywhere
        _path_here(Path(config.data_dir or "data"), "--data-dir",
                   f"give an existing directory, or run `ddl prepare --plugin "
                   f"{config.plugin} --data-dir {config.data_dir}` on a login node")
    if config.resume not in ("none", "auto"):
        _path_here(Path(config.resume), "--resume",
                   "allowed: none, auto, or the path of a checkpoint or a run directory")
    return notes


def tp_degree(config: RunConfig, world: int) -> int | None:
    """The tensor-parallel degree the job will run, where it is known without the
    strategy's own rules (torch): named in --mesh, or --strategy tp (tp over the whole
    world). None: another layout; the job's pre-flight checks it."""
    if "tp" in config.mesh:
        return config.mesh["tp"]
    if config.strategy == "tp":
        return world
    return None


def _tensor_parallel(config: RunConfig, preset, world: int, per_node: int) -> list[str]:
    """tp must divide the model's attention heads (ddl.contract.layout.check_heads: the
    rule the workload applies in the job, here on the count the preset declares, so the
    mistake costs no queue wait); a tp group wider than a node is allowed, but said."""
    tp = tp_degree(config, world)
    if not tp or tp < 2:
        return []
    heads = getattr(preset, "attention_heads", None)
    if heads:
        check_heads(heads, tp)
    if per_node % tp == 0:  # tp ranks are neighbours: each group inside one node
        return []
    return [f"tp={tp}: tensor-parallel groups span nodes ({per_node} GPUs per node), so every "
            "layer's all-reduces cross the network instead of the node's links; allowed, but "
            f"a tp dividing {per_node} keeps them inside a node, with the rest on dp or pp "
            "(`ddl layout --mesh ... --nodes N` shows which rank holds what)"]


def check_path_lengths(paths: dict[str, Path | str | None]) -> None:
    """Each path the job will use within Linux's limits (NAME_MAX 255 bytes a name,
    PATH_MAX 4096 in all, less room for what ddl writes below a run dir): otherwise the
    job would fail at its first file, after the queue wait."""
    for flag, path in paths.items():
        if path is None or "://" in str(path):  # a registry reference is no file
            continue
        text = str(path)
        longest = max((len(part.encode()) for part in Path(text).parts), default=0)
        if longest > NAME_MAX:
            raise UsageError(f"{flag}: {text[:40]}... has a name of {longest} bytes; allowed: "
                             f"at most {NAME_MAX} bytes a name (the file system's limit)")
        if len(text.encode()) > PATH_MAX - BELOW_RUN_DIR:
            raise UsageError(f"{flag}: {text[:40]}... is {len(text.encode())} bytes long; "
                             f"allowed: at most {PATH_MAX - BELOW_RUN_DIR}")


def _strategy_options(config: RunConfig, plugins) -> None:
    spec = plugins.strategy(config.strategy)
    if spec.options is None:  # not declared by its plugin: the job checks them
        return
    unknown = sorted(set(config.strategy_options) - spec.options)
    if unknown:
        allowed = ", ".join(sorted(spec.options)) or "none"
        raise UsageError(f"--strategy-option: {spec.name} has no option {unknown[0]!r}; "
                         f"allowed: {allowed}")


def _gpus(site: SiteProfile, device: str, gpus: int | None) -> None:
    """No GPU on a GPU site trains on the nodes' CPUs: only when --device cpu says so."""
    if gpus == 0 and site.accelerator != "cpu" and device != "cpu":
        raise UsageError(f"--gpus-per-node: 0 on {site.name}, whose nodes have "
                         f"{site.accelerator} GPUs; allowed: 1 or more (or --device cpu)")


def _mesh(config: RunConfig, world: int) -> None:
    """The degrees of --mesh against the job's world (nodes x processes per node)."""
    if not config.mesh:
        return
    if config.strategy == "mesh":  # the composed strategy's rule, as `ddl layout` applies it
        resolve(config.mesh, world, strategy="mesh", allowed=MESH_ALLOWED,
                dp_means=MESH_DP_MEANS, fill=MESH_FILL)
        return
    product = 1  # any strategy: the named degrees are factors of the world
    for size in config.mesh.values():
        product *= size
    if product < 1 or world % product:
        named = ",".join(f"{d}={s}" for d, s in config.mesh.items())
        raise UsageError(f"--mesh: {named} does not divide the job's {world} processes "
                         f"(--nodes x GPUs per node); allowed: degrees whose product divides "
                         f"{world}")


def _path_here(path: Path, flag: str, allowed: str) -> None:
    """A path the job will read must exist, when its file system is on this machine."""
    where = absolute(path, f"--{flag.lstrip('-')}")  # a symlink loop: one line
    top = Path(*where.parts[:2])
    if where.exists() or not top.exists():
        return
    raise UsageError(f"--{flag.lstrip('-')}: {where} does not exist; {allowed}")
