"""``ddl watch RUN_DIR``: a live terminal view of a running job, read from its run directory.

Each rank replaces ``RUN_DIR/live/rank-<r>.json`` every few seconds while it trains
(ddl.worker.observe.live); rank 0 appends each epoch to ``metrics.jsonl``. The view shows the epoch's
progress, throughput, an ETA, rank 0's latest loss, the last epoch's metrics and one row per
rank (phase, step, samples/s, CPU and GPU use, memory, the age of its file), redrawn every
``--interval`` seconds; it reads files only, so it works from a login node on a shared file
system while the job runs on compute nodes, and never disturbs the run.

A rank whose file is older than three times its write interval (or its step time, if that is
longer) while it trains is marked STALE: its loop has not moved (a hang, a stopped process,
a dead node; or clocks that differ between nodes). The view ends by itself when the run
does: exit 0 once it finished (``results.json``, or every rank says finished), 3 when it
stopped for a resume, 1 when it failed or its launcher on this host is gone without a
result. Not on a terminal (a pipe, a log) it prints one status line per refresh and the full
view at the end. ``--once`` prints the view once and exits 0, for scripts. A RUN_DIR that
is not there yet (``ddl train &`` then ``ddl watch`` at once) is waited for, up to
``--wait`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddl.contract.errors import DdlError, UsageError
from ddl.settings import rundir

#: A training rank is stale when its file is older than this many write intervals.
STALE_INTERVALS = 3
_MARKERS = (rundir.CONFIG, rundir.RESULTS, rundir.METRICS, rundir.LIVE, "plan.json")


@dataclass
class Snapshot:
    """What the run directory said at one moment."""

    run_dir: Path
    now: float  # wall-clock time of the reading
    ranks: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # None: unreadable
    epochs: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl
    config: dict[str, Any] = field(default_factory=dict)
    results: bool = False
    holder_alive: bool | None = None  # the process holding .lock on this host; None: unknown

    @property
    def lead(self) -> dict[str, Any] | None:
        """Rank 0's state (else the lowest rank's): the run's progress and loss."""
        docs = [d for _, d in sorted(self.ranks.items()) if d]
        return docs[0] if docs else None

    @property
    def world_size(self) -> int:
        """Rank 0's world (files of an older attempt's larger world may be left), else the
        largest any rank names."""
        if self.ranks.get(0) and self.ranks[0].get("world_size"):
            return self.ranks[0]["world_size"]
        sizes = [d.get("world_size", 0) for d in self.ranks.values() if d]
        return max(sizes, default=0) or len(self.ranks)


#: How long the live view waits for a run directory that is not there yet (``ddl train &``
#: followed at once by ``ddl watch``: the launcher creates it a moment later).
WAIT_S = 60.0


def cmd_watch(ns: argparse.Namespace) -> int:
    if not ns.interval > 0:
        raise UsageError(f"--interval: {ns.interval:g} is not a positive number of seconds")
    wait = ns.wait if ns.wait is not None else (0.0 if ns.once else WAIT_S)
    if not wait >= 0:
        raise UsageError(f"--wait: {ns.wait:g} is not a number of seconds >= 0")
    run_dir = wait_for_run_dir(ns.run_dir, wait, ns.interval)
    if ns.once:
        print("\n".join(render(read(run_dir))))
        return 0
    tty = sys.stdout.isatty()
    while True:
        snap = read(run_dir)
        ended, code, why = verdict(snap)
        if tty:  # redraw in place: home, each line cleared to its end, the rest wiped
            view = render(snap)
            sys.stdout.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in view)
                             + "\x1b[J")
        elif not ended:
            print(status_line(snap))
        if ended:
            if not tty:
                print("\n".join(render(snap)))
            print(f"ddl watch: {why}")
            return code
        sys.stdout.flush()
        time.sleep(ns.interval)


def wait_for_run_dir(path: Path, wait_s: float, interval_s: float) -> Path:
    """``path`` once it is a run directory; until then, for up to ``wait_s`` seconds, one
    line saying so and a look every ``interval_s``. A file is refused at once."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            return check_run_dir(path)
        except UsageError:
            if path.is_file() or time.monotonic() >= deadline:
                raise
        if not told:
            print(f"ddl watch: waiting up to {wait_s:g} s for {path} to become a run "
                  "directory (Ctrl-C leaves)", flush=True)
            told = True
        time.sleep(min(interval_s, max(deadline - time.monotonic(), 0.0)))


def check_run_dir(path: Path) -> Path:
    """``path`` if it is a run directory, else a one-line UsageError."""
    if not path.exists():
        raise UsageError(f"RUN_DIR: {path} does not exist")
    if not path.is_dir():
        raise UsageError(f"RUN_DIR: {path} is not a directory")
    if not any((path / name).exists() for name in _MARKERS):
        raise UsageError(f"RUN_DIR: {path} is not a ddl run directory (none of "
                         f"{', '.join(_MARKERS)}); give the directory `ddl train` wrote")
    return path


def read(run_dir: Path, now: float | None = None) -> Snapshot:
    snap = Snapshot(run_dir, time.time() if now is None else now,
                    results=(run_dir / rundir.RESULTS).is_file(),
                    holder_alive=_holder_alive(run_dir / rundir.LOCK))
    for path in sorted((run_dir / rundir.LIVE).glob("rank-*.json")):
        rank = path.stem.rpartition("-")[2]
        if rank.isdigit():
            snap.ranks[int(rank)] = _json(path)
    size = snap.world_size
    snap.ranks = {r: d for r, d in snap.ranks.items() if r < size}  # an older, larger world's
    snap.config = _json(run_dir / rundir.CONFIG) or {}
    try:
        snap.epochs = rundir.read_jsonl(run_dir / rundir.METRICS)
    except (DdlError, OSError):  # damaged: the view goes on without it
        snap.epochs = []
    return snap


def verdict(snap: Snapshot) -> tuple[bool, int, str]:
    """(whether the run has ended, the exit code for it, what to say)."""
    if snap.results:
        return True, 0, f"the run finished ({snap.run_dir / rundir.RESULTS})"
    docs = [snap.ranks.get(r) for r in range(snap.world_size)]
    states = {d.get("state") for d in docs if d}
    if docs and all(d and d.get("state") == "finished" for d in docs):
        return True, 0, "the run finished (every rank says so)"
    if snap.holder_alive:  # its launcher lives: a failed attempt may be restarted
        return False, 0, ""
    if "failed" in states:
        reasons = {d.get("reason") for d in docs if d and d.get("state") == "failed"}
        return True, 1, "the run failed: " + "; ".join(sorted(str(r) for r in reasons if r))
    if "stopped" in states:
        return True, 3, "the run stopped; `ddl train ... --resume auto` continues it"
    if snap.holder_alive is False:
        return True, 1, "the run's process is gone and left no results (killed?)"
    return False, 0, ""


def stale(doc: dict[str, Any], now: float) -> bool:
    """A training rank whose file did not change for STALE_INTERVALS x its write interval
    (or step time, if longer)."""
    if doc.get("state") != "running" or doc.get("phase") != "training":
        return False
    every = max(doc.get("write_interval_s") or 0, doc.get("step_time_s") or 0)
    return now - doc.get("time", now) > STALE_INTERVALS * every


def render(snap: Snapshot) -> list[str]:
    """The view, one string per line."""
    lead = snap.lead
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.now))
    lines = [f"ddl watch {snap.run_dir}   {when}"]
    if lead is None:
        lines += [_about(snap.config, snap.config.get("nproc")),
                  "finished" if snap.results else
                  "no live state yet: the ranks write it once training starts"]
        return lines + _last_epoch(snap.epochs)
    state = "finished" if snap.results else lead.get("state", "?")
    started, running = lead.get("started"), state == "running"
    ago = "" if not started else f"  ·  started {_clock(snap.now - started)} ago" if running \
        else f"  ·  ran {_clock(lead.get('time', started) - started)}"
    lines.append(f"{_about(lead, snap.world_size)}  ·  {state}"
                 + (f" ({lead.get('phase')})" if running else "") + ago)
    lines += _progress(lead, snap)
    lines += _last_epoch(snap.epochs)
    lines += [""] + _table(snap)
    return lines


def status_line(snap: Snapshot) -> str:
    """One line per refresh when the output is not a terminal."""
    lead = snap.lead
    if lead is None:
        return f"{time.strftime('%H:%M:%S')} waiting for the ranks' live state"
    live = sum(1 for d in snap.ranks.values() if d and not stale(d, snap.now))
    rate = lead.get("samples_per_s")
    return (f"{time.strftime('%H:%M:%S')} epoch {lead.get('epoch')}/{lead.get('epochs')} "
            f"step {lead.get('step_in_epoch')}/{lead.get('steps_per_epoch')} "
            f"{lead.get('phase')}  {f'{rate:.0f} samples/s' if rate else '-'}  "
            f"ETA {_eta(lead, snap)[1]}  ranks {live}/{snap.world_size} live")


def _about(doc: dict[str, Any], ranks) -> str:
    plugin, strategy = doc.get("plugin", "?"), doc.get("strategy", "?")
    preset = f" ({doc['preset']})" if doc.get("preset") else ""
    device = f", {doc['device']}" if doc.get("device") else ""
    return f"{plugin}{preset} with {strategy} on {ranks or '?'} rank(s){device}"


def _progress(lead: dict[str, Any], snap: Snapshot) -> list[str]:
    steps, epochs = lead.get("steps_per_epoch") or 0, lead.get("epochs") or 0
    epoch, done = lead.get("epoch") or 0, lead.get("step_in_epoch") or 0
    if not epoch:
        return ["epoch -: setting up"]
    total = steps * epochs
    run_done = (epoch - 1) * steps + done
    filled = 30 * done // max(steps, 1)
    lines = [(f"epoch {epoch}/{epochs} [{'#' * filled}{'.' * (30 - filled)}] step "
              f"{done}/{steps} ({100 * done // max(steps, 1)} %)   run {run_done}/{total} "
              f"steps ({100 * run_done // max(total, 1)} %)")]
    rate, per_step = lead.get("samples_per_s"), lead.get("step_time_s")
    epoch_eta, run_eta = _eta(lead, snap)
    lines.append(f"throughput {f'{rate:,.0f} samples/s' if rate else '-'}"
                 + (f"  ·  {per_step:.4g} s/step" if per_step else "")
                 + f"  ·  ETA epoch {epoch_eta}, run {run_eta}")
    if lead.get("loss") is not None:
        lines.append(f"loss {lead['loss']:.4f} (rank {lead.get('rank', 0)}, step "
                     f"{lead.get('loss_step')})")
    return lines


def _eta(lead: dict[str, Any], snap: Snapshot) -> tuple[str, str]:
    """(the rest of this epoch's steps, the rest of the run) from the recent step time and
    the last validation's time; '-' before there is a step time."""
    per_step = lead.get("step_time_s")
    if snap.results or lead.get("state") != "running":
        return "-", "-"
    if not per_step:
        return "-", "-"
    steps, epochs = lead.get("steps_per_epoch") or 0, lead.get("epochs") or 0
    epoch, done = lead.get("epoch") or 1, lead.get("step_in_epoch") or 0
    this_epoch = (steps - done) * per_step
    evals = epochs - epoch + (1 if lead.get("phase") == "training" else 0)
    eval_s = snap.epochs[-1].get("eval_time_s", 0.0) if snap.epochs else 0.0
    rest = this_epoch + (epochs - epoch) * steps * per_step + evals * eval_s
    return _clock(this_epoch), _clock(rest)


def _last_epoch(epochs: list[dict[str, Any]]) -> list[str]:
    if not epochs:
        return []
    last = epochs[-1]
    wait = last.get("data_wait_s", 0) / last["time_s"] if last.get("time_s") else 0
    return [(f"last epoch {last.get('epoch')}: train {_fmt(last.get('train', {}))} | val "
             f"{_fmt(last.get('val', {}))} | {last.get('time_s', 0):.1f} s, "
             f"{last.get('samples_per_s', 0):.0f} samples/s, data wait {100 * wait:.0f} %")]


def _table(snap: Snapshot) -> list[str]:
    gpu = any(d and (d.get("device") == "cuda" or d.get("device_util_percent") is not None)
              for d in snap.ranks.values())
    head = ["rank", "host", "phase", "step", "samples/s", "CPU %"]
    head += ["GPU %", "GPU memory (now / peak / total)"] if gpu else []
    head += ["RSS (now / peak)", "updated"]
    rows = [head]
    for rank in range(snap.world_size):
        doc = snap.ranks.get(rank)
        if not doc:
            rows.append([str(rank), "-", "no live state yet" if rank not in snap.ranks
                         else "unreadable file"])
            continue
        memory = doc.get("memory") or {}
        row = [str(rank), str(doc.get("host", "?")), _phase(doc),
               f"{doc.get('step_in_epoch')}/{doc.get('steps_per_epoch')}",
               _number(doc.get("samples_per_s")), _number(doc.get("cpu_percent"))]
        if gpu:
            row += [_number(doc.get("device_util_percent")),
                    " / ".join(_bytes(memory.get(k)) for k in (
                        "device_allocated_bytes", "device_peak_allocated_bytes"))
                    + f" / {_bytes(doc.get('device_total_bytes'))}"]
        age = max(snap.now - doc.get("time", snap.now), 0.0)
        row += [f"{_bytes(memory.get('rss_bytes'))} / {_bytes(memory.get('peak_rss_bytes'))}",
                f"{age:.1f} s ago" + ("  STALE" if stale(doc, snap.now) else "")]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def _phase(doc: dict[str, Any]) -> str:
    state = doc.get("state", "?")
    return doc.get("phase", "?") if state == "running" else state


def _holder_alive(lock: Path) -> bool | None:
    """Whether the process named in ``.lock`` ("pid N on HOST") still runs; None when it
    runs on another host (or the file says nothing)."""
    try:
        words = lock.read_text().split()
    except OSError:
        return None
    if len(words) != 4 or not words[1].isdigit() or words[3] != socket.gethostname():
        return None
    try:
        state = Path(f"/proc/{words[1]}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"  # a zombie has ended: only its parent's wait is missing
    except OSError:
        pass
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def _json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _fmt(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, (int, float)))


def _number(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _bytes(value) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(max(seconds, 0)), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
