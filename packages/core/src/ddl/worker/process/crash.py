"""A worker's exception from plugin (or ddl) code, told in one line.

The worker works out who failed (the workload plugin, its model, the strategy, or ddl
itself: the outermost frame whose ``self`` is one of them), in which hook and phase (a
training step, validation, set-up: the ddl frame around it), and writes the full traceback
to ``RUN_DIR/logs/rank<N>-traceback.txt`` and a small record beside it
(``rank<N>-error.json``). A data error (``ddl.worker.train.samples.SampleError``) names the split
and the sample instead of a code location.

Who prints the one line: the local launcher, after every worker ended, merges the records
of all failed ranks into one (workers under it stay silent, see :data:`LAUNCHER_REPORTS`);
a single process, or each failing rank under Slurm (where no process sees every rank),
prints its own.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

from ddl.contract.errors import DdlError, as_one_line

#: Set by the local launcher for its workers: it prints the run's one line from the records.
LAUNCHER_REPORTS = "DDL_LAUNCHER_REPORTS"
#: A worker's exit code under that launcher when it only lost contact with a failed rank and
#: said nothing (exit 1 means it printed an error of its own).
LOST_CONTACT = 75

# ddl's frames that say in which phase of the run an exception happened (innermost wins)
_PHASES = {("ddl.worker.train.epoch", "train_epoch"): "a training step",
           ("ddl.worker.train.epoch", "validate"): "validation",
           ("ddl.worker.train.trainer", "_finish"): "the test",
           ("ddl.worker.train.setup", "build"): "set-up",
           ("ddl.worker.train.setup", "set_up"): "set-up",
           ("ddl.worker.checkpointing.resume", "start"): "the resume",
           ("ddl.worker.checkpointing.checkpoint", "save"): "a checkpoint",
           # --async-checkpoint: the save, and a write error raised when it is waited for
           ("ddl.worker.checkpointing.checkpoint_writer", "save"): "a checkpoint",
           ("ddl.worker.checkpointing.checkpoint_writer", "wait"): "a checkpoint"}
# the split an evaluation loader serves, by phase (ddl.worker.train.samples.UNNAMED)
_EVAL_SPLIT = {"validation": "val", "the test": "test"}


class Failed(DdlError):
    """An exception in a worker, already written to RUN_DIR/logs/; the message is this rank's
    one line. ``saved``: whether the record is there for the launcher to read."""

    def __init__(self, message: str, saved: bool) -> None:
        super().__init__(message)
        self.saved = saved

    def should_print(self) -> bool:
        return not (self.saved and os.environ.get(LAUNCHER_REPORTS))


def failed(exc: BaseException, rank: int, plan: Any) -> Failed:
    """Record ``exc`` (raised on ``rank``) and return the :class:`Failed` to raise instead."""
    import tempfile

    folder = plan.run_dir / "logs" if plan is not None else Path(tempfile.gettempdir())
    try:
        record = describe(exc, plan)
    except Exception:  # noqa: BLE001 - the report must not fail in its turn
        record = {"subject": "", "what": "the run",
                  "rest": f"{type(exc).__name__}: {_last_line(exc)}"}
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{rank}-traceback.txt"
        path.write_text(text)
        record["traceback"] = str(path)
        tmp = folder / f".rank{rank}-error.json"
        tmp.write_text(json.dumps(record))
        tmp.replace(folder / f"rank{rank}-error.json")
        saved = True
    except OSError:
        import sys

        sys.stderr.write(text)
        saved = False
    return Failed(summary({rank: record}), saved)


def record_line(folder: Path, rank: int, line: str) -> bool:
    """Record a failure of ``rank`` that is already one line (a hung rank, seen by another
    one); True if the launcher will print it (else the caller prints it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".rank{rank}-error.json"
        tmp.write_text(json.dumps({"line": line, "subject": "", "what": "", "rest": line}))
        tmp.replace(folder / f"rank{rank}-error.json")
    except OSError:
        return False
    return bool(os.environ.get(LAUNCHER_REPORTS))


def describe(exc: BaseException, plan: Any) -> dict[str, str]:
    """{subject, what, rest}: "plugin 'x'", "forward() in a training step", "RuntimeError:
    ... (at ddl_x/model.py:42 in forward)"."""
    from ddl.worker.train.samples import UNNAMED, SampleError

    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    phase = next((_PHASES[key] for key in ((f.f_globals.get("__name__"), f.f_code.co_name)
                                           for f in reversed(frames)) if key in _PHASES), "")
    plugin = plan.config.plugin if plan is not None else "?"
    if isinstance(exc, SampleError):
        line = exc.line.replace(f"the {UNNAMED} split's",
                                f"the {_EVAL_SPLIT.get(phase, UNNAMED)} split's", 1)
        what, _, rest = line.partition(" failed: ")
        return {"subject": f"plugin '{plugin}'", "what": what, "rest": rest}
    owner, hook = _owner(frames)
    subject = {"workload": f"plugin '{plugin}'", "model": f"plugin '{plugin}'",
               "strategy": f"strategy '{plan.config.strategy}'" if plan else ""}.get(owner, "")
    hook = f"the model's {hook}()" if owner == "model" else f"{hook}()" if hook else ""
    what = f"{hook} in {phase}" if hook and phase else hook or phase or "the run"
    return {"subject": subject, "what": what,
            "rest": f"{type(exc).__name__}: {_last_line(exc)}{_code_location(exc)}"}


def _owner(frames: list) -> tuple[str, str]:
    """("workload" | "model" | "strategy" | "", the hook): the outermost frame whose ``self``
    is the workload, else the plugin's model, else the strategy."""
    import torch

    from ddl.contract.strategy import Strategy
    from ddl.contract.workload import Workload

    def is_model(obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module) and \
            not type(obj).__module__.startswith(("torch.", "ddl."))

    found: dict[str, str] = {}
    for frame in frames:
        owner = frame.f_locals.get("self")
        kind = ("workload" if isinstance(owner, Workload) else "model" if is_model(owner)
                else "strategy" if isinstance(owner, Strategy) else "")
        if kind:
            found.setdefault(kind, frame.f_code.co_name)
    kind = next((k for k in ("workload", "model", "strategy") if k in found), "")
    return kind, found.get(kind, "")


def _last_line(exc: BaseException) -> str:
    """The first line of the message; from a DataLoader worker ("Caught X in DataLoader
    worker process 0. Original Traceback ...") the traceback's last line."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    line = lines[-1].partition(": ")[2] if lines[0].startswith("Caught ") else lines[0]
    return as_one_line(line[:300])



def _code_location(exc: BaseException) -> str:
    """The innermost frame of ddl's or a plugin's code (a package named ddl or ddl_*) in the
    traceback, e.g. ``(at ddl_gpt/model.py:42 in forward)``: where a plugin author looks."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__)
            if any(part == "ddl" or part.startswith("ddl_") for part in Path(f.filename).parts)]
    if not ours:
        return ""
    frame = ours[-1]
    parts = Path(frame.filename).parts
    start = max(i for i, p in enumerate(parts) if p == "ddl" or p.startswith("ddl_"))
    return f" (at {'/'.join(parts[start:])}:{frame.lineno} in {frame.name})"


def summary(records: dict[int, dict[str, str]], first: int | None = None) -> str:
    """One line for the failed ranks: the first rank's failure (``first``, else the lowest
    rank), the ranks that failed the same way, what the others failed in, the tracebacks."""
    said = next((rec["line"] for rec in records.values() if "line" in rec), None)
    if said:  # a rank that hung: what the others then failed in follows from it
        return said
    lead = records[first if first in records else min(records)]
    key = (lead["subject"], lead["what"], lead["rest"])
    same = sorted(r for r, rec in records.items()
                  if (rec["subject"], rec["what"], rec["rest"]) == key)
    other = sorted(set(records) - set(same))
    text = (f"{lead['subject'] + ': ' if lead['subject'] else ''}{lead['what']} failed on "
            f"{_ranks(same)}: {lead['rest']}")
    if other:  # e.g. another sample of the same split
        text += f"; also {_ranks(other)}: {records[other[0]]['what']}" + \
            (" and more" if len(other) > 1 else "")
    paths = [records[r].get("traceback") for r in sorted(records)]
    if len(records) == 1 and paths[0]:
        text += f"; traceback: {paths[0]}"
    elif paths and all(paths):
        text += f"; tracebacks: {Path(paths[0]).parent}/rank<N>-traceback.txt"
    return text


def _ranks(ranks: list[int]) -> str:
    """"rank 3", "ranks 0, 1", "ranks 0-63" (consecutive runs shortened)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    text = ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 2 else ", ".join(map(str, g)) for g in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def read(folder: Path, since: float) -> dict[int, dict[str, str]]:
    """The records workers wrote to ``folder`` at or after ``since`` (not an earlier run's)."""
    records = {}
    for path in folder.glob("rank*-error.json"):
        try:
            if path.stat().st_mtime >= since - 1:  # 1 s: file times may lag the clock
                records[int(path.name[4:-len("-error.json")])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # unreadable: the launcher falls back to the exit codes
    return records
