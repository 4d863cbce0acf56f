"""Checkpoints: save a run's complete training state, resume it, on any number of ranks.

One checkpoint is one directory under ``<run_dir>/checkpoints/``::

    step-00000120/
        .metadata, __*.distcp   model + optimizer, written by torch.distributed.checkpoint
                                (DCP): every rank writes its own shards, keyed by the
                                parameter's name in the *unwrapped* model, so a checkpoint
                                saved by N ranks under one strategy loads into M ranks (or
                                another strategy, or one plain process) — DCP reshards.
        trainer.json            step, epoch, position in the epoch, LR scheduler, world size
        rng-00000.pt ...        each rank's RNG states (torch.load(weights_only=True))
        manifest.json           every other file's size and sha256, written last
    latest                      the name of the newest complete checkpoint

Why this order makes it crash-safe: everything is written into ``.step-N.partial`` (DCP
fsyncs its files, ddl fsyncs its own), the directory is renamed to ``step-N`` only once
every rank has finished, and ``latest`` is replaced last. A kill at any moment leaves the
previous checkpoint and ``latest`` untouched; a leftover ``.partial`` directory is never
read and is removed when a run starts in the directory (``remove_leftovers``).
``--async-checkpoint`` (``ddl.worker.checkpoint_async``) runs the same steps, the DCP write
and the commit in a thread of each rank.

What is trusted on load (docs/checkpoints.md): a checkpoint is used only when it verifies
against its manifest (``ddl.worker.checkpointing.checkpoint_manifest``; the choice among
checkpoints is
``ddl.worker.checkpointing.checkpoint_choice``), and even then no file can run code: ``.metadata``
is read
through an allow-listing unpickler and every other pickle weights-only
(``ddl.worker.checkpointing.safe_load``); ``trainer.json`` is JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddl.contract.errors import UsageError
from ddl.worker.checkpointing import checkpoint_manifest, safe_load

if TYPE_CHECKING:
    import torch

    from ddl.contract.world import World

DIR = "checkpoints"
LATEST = "latest"
TRAINER = "trainer.json"
#: For the crash tests only: every rank SIGKILLs itself inside the save of this step, after its
#: shards are written and before the checkpoint is made visible.
FAULT_KILL_ENV = "DDL_TEST_KILL_DURING_CHECKPOINT"
_STEP = re.compile(r"^step-(\d{8})$")
_PARTIAL = re.compile(r"^\.step-\d{8}\.partial$")


@dataclass
class TrainerState:
    """Where training stands: the next batch to run is ``position`` of ``epoch``."""

    step: int
    epoch: int
    position: int
    global_batch: int
    world_size: int
    scheduler: dict[str, Any] = field(default_factory=dict)
    plugin: str = ""
    preset: str = ""
    strategy: str = ""
    steps_per_epoch: int = 0  # of the run that saved it (0: written by an older ddl)


# --- finding checkpoints ---------------------------------------------------------------
def _is_complete(path: Path) -> bool:
    return (path / ".metadata").is_file() and (path / TRAINER).is_file()


def pointed(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, if it names a ``step-*`` directory of this run
    (never a path elsewhere, nor a symlink leading out of the run directory)."""
    root = Path(run_dir) / DIR
    try:
        name = (root / LATEST).read_text(errors="replace").strip()
    except OSError:
        return None
    named = root / name
    return named if _STEP.match(name) and inside(named, root) else None


def inside(path: Path, root: Path) -> bool:
    return path.resolve().parent == root.resolve()


def steps(run_dir: Path) -> list[Path]:
    """This run's ``step-*`` directories (inside the run directory), newest first."""
    root = Path(run_dir) / DIR
    return sorted((p for p in root.glob("step-*") if _STEP.match(p.name) and p.is_dir()
                   and inside(p, root)), reverse=True)


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None: the highest complete ``step-*``,
    whatever ``latest`` says (it is written last, so a kill or Ctrl-C can leave it naming the
    one before). Structure only: what a resume may use is decided by
    ``ddl.worker.checkpointing.checkpoint_choice``, which verifies."""
    return next((p for p in steps(run_dir) if _is_complete(p)), None)


def resolve(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint ``--resume`` asks for: ``none``; ``auto`` = this run's newest, if any;
    or a path to a checkpoint directory or to a run directory (its newest checkpoint)."""
    if resume == "none":
        return None
    if resume == "auto":
        return latest(run_dir)
    path = Path(resume)
    shown = resume if len(resume) <= 60 else f"{resume[:40]}...{resume[-12:]}"
    try:
        if _is_complete(path):
            return path
        found = latest(path) if path.is_dir() else None
    except OSError as exc:  # a name too long, a directory it may not read: one line
        raise UsageError(f"--resume: cannot look into {shown} ({len(resume)} characters): "
                         f"{exc.strerror or exc}; allowed: none, auto, or the path of a "
                         "checkpoint or run directory") from None
    if found is None:
        raise UsageError(f"--resume: {shown} is neither a complete checkpoint nor a run "
                         "directory holding one; allowed: none, auto, or such a path")
    return found


def read_trainer_state(path: Path) -> TrainerState:
    """``trainer.json``; ValueError (one line) when it is not what ddl writes."""
    try:
        fields = json.loads((Path(path) / TRAINER).read_bytes())
        state = TrainerState(**fields)
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{TRAINER} is not a trainer state ({type(exc).__name__})") from None
    for name, kind in (("step", int), ("epoch", int), ("position", int),
                       ("global_batch", int), ("world_size", int), ("scheduler", dict),
                       ("plugin", str), ("preset", str), ("strategy", str),
                       ("steps_per_epoch", int)):
        value = getattr(state, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(  # noqa: TRY004 - callers report every bad file as ValueError
                f"{TRAINER}: {name} is {value!r}, not {kind.__name__}")
    why = _inconsistent(state)
    if why:
        raise ValueError(f"{TRAINER}: {why}")
    return state


def _inconsistent(state: TrainerState) -> str | None:
    """Why these counts cannot come from one training (a crafted or corrupted state whose
    manifest was rewritten would otherwise skip an epoch or count samples negative)."""
    for name, least in (("step", 0), ("epoch", 1), ("position", 0), ("global_batch", 1),
                        ("world_size", 1), ("steps_per_epoch", 0)):
        if getattr(state, name) < least:
            return f"{name} is {getattr(state, name)}, below {least}"
    if state.position > state.step:  # the batches of this epoch are steps of this training
        return f"position {state.position} is beyond step {state.step}"
    if state.steps_per_epoch and state.position >= state.steps_per_epoch:
        return (f"position {state.position} is outside an epoch of {state.steps_per_epoch} "
                "steps")
    return None


# --- names -------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def rng_states() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")),
                      "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype("uint32"), n["pos"],
                         n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run_dir: Path, world: World, strategy, context, model, optimizer,
         trainer: TrainerState, keep: int) -> Path:
    """Write one checkpoint (a collective: every rank calls it) and return its path."""
    import torch.distributed.checkpoint as dcp

    partial = begin(run_dir, world, trainer)
    dcp.save(strategy.checkpoint_state(model, optimizer, context), checkpoint_id=partial)
    write_own_files(partial, world, trainer)
    if os.environ.get(FAULT_KILL_ENV) == str(trainer.step):
        os.kill(os.getpid(), signal.SIGKILL)  # tests: die mid-write, as a node failure would
    return commit(partial, world, keep)


def begin(run_dir: Path, world: World, trainer: TrainerState) -> Path:
    """The empty ``.step-N.partial`` directory a save writes into (all ranks call it)."""
    import torch.distributed as dist

    root = Path(run_dir) / DIR
    partial = root / f".step-{trainer.step:08d}.partial"
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by a kill during an earlier save
        partial.mkdir()
    dist.barrier()
    return partial


def write_own_files(partial: Path, world: World, trainer: TrainerState) -> None:
    """This rank's RNG states and (rank 0) trainer.json, fsynced: taken now, at the step
    the checkpoint resumes from."""
    _write_synced(partial / f"rng-{world.rank:05d}.pt", _to_bytes(rng_states()))
    if world.is_main:
        _write_synced(partial / TRAINER, json.dumps(asdict(trainer), indent=2).encode())


def commit(partial: Path, world: World, keep: int, group: Any = None) -> Path:
    """Make a written ``.partial`` directory the newest checkpoint: manifest, rename,
    ``latest`` last (a collective over ``group``, the default one when None)."""
    import torch.distributed as dist

    root = partial.parent
    name = partial.name[1:-len(".partial")]
    final = root / name
    dist.barrier(group=group)  # every rank's files are on disk before the checkpoint is hashed
    _write_manifest(partial, world, group)
    if world.is_main:
        if final.exists():  # the same step saved again (a resumed run): replace it whole
            shutil.rmtree(final)
        _fsync_dir(partial)
        partial.rename(final)
        tmp = root / f".{LATEST}.tmp"
        _write_synced(tmp, name.encode())
        tmp.replace(root / LATEST)
        _fsync_dir(root)
        _prune(root, keep, final)
    dist.barrier(group=group)
    return final


def _write_manifest(partial: Path, world: World, group: Any = None) -> None:
    """Each rank hashes its share of the files; rank 0 writes the manifest (fsynced) before
    the directory is renamed into place."""
    import torch.distributed as dist

    names = checkpoint_manifest.file_names(partial)
    mine = checkpoint_manifest.entries(
        partial, checkpoint_manifest.my_share(names, world.rank, world.size))
    gathered: list[Any] = [None] * world.size
    dist.all_gather_object(gathered, mine, group=group)
    if world.is_main:
        checkpoint_manifest.write(partial, [e for share in gathered for e in share])


def _to_bytes(obj: Any) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _prune(root: Path, keep: int, written: Path) -> None:
    """Keep the ``keep`` newest, ``written`` the newest of all: a checkpoint numbered above
    it belongs to training this run abandoned (a resume skipped it as damaged), and would
    otherwise outrank every new one, and ``keep 1`` would delete the one just written."""
    steps = sorted(p for p in root.glob("step-*") if _STEP.match(p.name) and p.is_dir()
                   and not p.is_symlink())
    for old in [p for p in steps if p.name > written.name] + \
            [p for p in steps if p.name <= written.name][:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def remove_leftovers(run_dir: Path) -> list[str]:
    """Remove what killed saves of this run left in its checkpoint directory (rank 0, before
    training starts; the run directory's lock keeps any other run out): ``.step-N.partial``
    directories and ``.latest.tmp``. Only those exact names, never through a link. Returns
    the names removed."""
    root = Path(run_dir) / DIR
    removed = []
    for path in sorted(root.glob(".*")) if root.is_dir() else []:
        name = path.name
        if path.is_symlink() or not (_PARTIAL.match(name) and path.is_dir()
                                     or name == f".{LATEST}.tmp" and path.is_file()):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(name)
    return removed


# --- loading -----------------------------------------------------------------------------
def load(path: Path, world: World, strategy, context, model, optimizer) -> TrainerState:
    """Load model, optimizer and this rank's RNG states into an already built run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    state = strategy.checkpoint_state(model, optimizer, context)
    try:
        dcp.load(state, storage_reader=safe_load.reader(path), planner=safe_load.planner())
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP's: BaseException
        raise UsageError(f"--resume: {path} does not fit this model and strategy: "
                         f"{_first_reason(exc)}") from None
    strategy.load_checkpoint_state(model, optimizer, state, context)
    trainer = read_trainer_state(path)
    rng = path / f"rng-{world.rank:05d}.pt"
    if trainer.world_size == world.size and rng.is_file():
        set_rng_states(safe_load.load_weights_only(rng))
    return trainer


def _first_reason(exc: BaseException) -> str:
    found = re.search(r"(Missing key[^\n]*|[Ss]ize mismatch[^\n]*|shape[^\n]*)", str(exc))
    return found.group(1).rstrip(".") if found else type(exc).__name__
