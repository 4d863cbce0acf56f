"""Which checkpoint a resume uses: the newest one that verifies.

``--resume auto`` (and ``--resume RUN_DIR``) walk the run's checkpoints newest first (by step:
``latest`` is written last, so a kill or Ctrl-C can leave it naming the one before; one line
says so) and take the first that verifies; each newer one skipped gets one line saying which
and why. ``--resume CHECKPOINT`` names one
checkpoint: if it does not verify, that is one line naming the file, exit 2.

"Verifies" means: its manifest matches every file (``checkpoint_manifest``), ``trainer.json``
is a trainer state with consistent counts, ``.metadata`` passes the allow-listing unpickler,
every non-tensor item DCP stored (optimizer hyper-parameters) and this rank's RNG file load
weights-only (``safe_load``): a crafted item is found here, where an older checkpoint can
still be taken, not halfway through loading. Every rank checks its share of the checksums and the
verdicts are gathered, so all ranks take the same checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError
from ddl.worker.checkpointing import checkpoint, checkpoint_manifest, safe_load


def problem(path: Path, rank: int = 0, world_size: int = 1) -> str | None:
    """Why this rank may not use checkpoint ``path``, or None (see the module's doc)."""
    try:
        why = checkpoint_manifest.problem(path, rank, world_size)
        if why:
            return why
        if rank == 0:
            checkpoint.read_trainer_state(path)
        why = _bytes_items_problem(Path(path), rank, world_size)
        if why:
            return why
        rng = Path(path) / f"rng-{rank:05d}.pt"
        if rng.is_file():
            safe_load.load_weights_only(rng)
    except ValueError as exc:  # UnsafeCheckpoint too
        return str(exc)
    except OSError as exc:
        return f"{Path(exc.filename or path).name}: {exc.strerror}"
    return None


def _bytes_items_problem(path: Path, rank: int, world_size: int) -> str | None:
    """Why one of this rank's share of the checkpoint's non-tensor items (DCP stores each
    as a torch.save stream at an offset of a data file) does not load weights-only."""
    import io

    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = safe_load.read_metadata(path)  # the allow-list first, on every rank
    stored = sorted(((index.fqn, info) for index, info in (metadata.storage_data or {}).items()
                     if isinstance(metadata.state_dict_metadata.get(index.fqn),
                                   BytesStorageMetadata)), key=lambda item: item[0])
    for fqn, info in stored[rank::world_size]:
        if getattr(info, "transform_descriptors", None):
            return f"item {fqn} is stored transformed ({info.transform_descriptors}), which " \
                   "ddl does not write"
        with open(path / info.relative_path, "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - UnpicklingError, a torn zip, ...
            return f"item {fqn} of {info.relative_path} does not load weights-only " \
                   f"({type(exc).__name__})"
    return None


def choose(resume: str, run_dir: Path, world: Any = None,
           say: Callable[[str], None] = print) -> Path | None:
    """The checkpoint ``--resume`` asks for, verified; None to start from step 0."""
    if resume == "none":
        return None
    if resume != "auto":
        path = Path(resume)
        if checkpoint.resolve(resume, run_dir) != path:  # a run directory: its newest
            return _newest_verified(path, world, say, resume)
        why = _agreed(path, world)
        if why:
            raise UsageError(f"--resume: checkpoint {path} does not verify: {why}; name an "
                             "older checkpoint of the run, or its run directory")
        return path
    return _newest_verified(Path(run_dir), world, say, "--resume auto")


def _newest_verified(run_dir: Path, world: Any, say: Callable[[str], None],
                     flag: str) -> Path | None:
    candidates = _broadcast(_candidates(run_dir, say), world)
    for path in candidates:
        why = _agreed(path, world)
        if why is None:
            return path
        say(f"ddl: skipping checkpoint {path.name}: {why}")
    if candidates:
        raise UsageError(f"{flag}: no checkpoint in {run_dir / checkpoint.DIR} verifies (see "
                         "above); move that directory away to start from step 0")
    return None


def _candidates(run_dir: Path, say: Callable[[str], None]) -> list[Path]:
    root = Path(run_dir) / checkpoint.DIR
    named = checkpoint.pointed(run_dir)
    if named is None and (root / checkpoint.LATEST).exists():
        try:
            text = (root / checkpoint.LATEST).read_text(errors="replace").strip()[:80]
        except OSError as exc:
            text = f"nothing readable ({exc.strerror})"
        say(f"ddl: ignoring {root / checkpoint.LATEST}: it names {text!r}, not a checkpoint "
            "directory of this run")
    found = checkpoint.steps(run_dir)  # newest first
    if named is not None and found and named != found[0]:
        say(f"ddl: {root / checkpoint.LATEST} names {named.name}, but {found[0].name} is "
            "newer (a save was interrupted before updating it); the newest that verifies "
            "is used")
    return found


def _agreed(path: Path, world: Any) -> str | None:
    """The first rank's reason not to use ``path`` (every rank gets the same answer)."""
    if world is None or world.size == 1 or not _distributed():
        return problem(path, 0, 1)
    import torch.distributed as dist

    verdicts: list[Any] = [None] * world.size
    dist.all_gather_object(verdicts, problem(path, world.rank, world.size))
    return next((why for why in verdicts if why), None)


def _broadcast(paths: list[Path], world: Any) -> list[Path]:
    if world is None or world.size == 1 or not _distributed():
        return paths
    import torch.distributed as dist

    box = [[str(p) for p in paths]]
    dist.broadcast_object_list(box, src=0)
    return [Path(p) for p in box[0]]


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Fill a plain, unwrapped model (one process, no process group) from a checkpoint,
    whatever strategy and number of ranks saved it: for inference or export. The checkpoint
    must verify and its metadata pass the allow-list, else UsageError (one line)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    why = problem(path)  # what a resume checks: manifest, trainer.json, allow-listed metadata
    if why:
        raise UsageError(f"checkpoint {path} not loaded: {why}")
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=safe_load.reader(path), planner=safe_load.planner())
    model.load_state_dict(state["model"])
