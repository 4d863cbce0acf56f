"""Where a training step's time goes, on rank 0: waiting for data, inside the strategy's
step (forward, backward, optimizer; on a GPU mostly the time to *launch* that work), and in
ddl's own code around it (metrics, progress, the step guard, the schedule); and, with
``--count-syncs``, how often the host waited for the device.

Why syncs matter: a GPU runs ahead of the Python that feeds it only while the host never
waits for a device value. One ``loss.item()`` per step makes the host wait for the whole
step, then the GPU waits for the host to prepare the next one: the device idles for the
host's share of every step. ddl reads device values only where a flag asks for it:
``--log-every`` (the loss for the progress line), ``--check-every`` (the non-finite/stop
check), a checkpoint, and each epoch's end. Every other step should read none.

How syncs are counted (``--count-syncs``):

- on CUDA, torch's own detector: ``torch.cuda.set_sync_debug_mode("warn")`` makes every
  synchronising CUDA call (``.item()``, a device-to-host copy, ``nonzero``, a mask index,
  a blocking host-to-device copy) raise a warning, which is counted here with the Python
  line that caused it. This sees syncs inside torch and in plugins' code alike.
- on a CPU there is no device to wait for, so the counter wraps the Python entry points
  that read a tensor's value (``item``, ``tolist``, ``numpy``, ``cpu``, ``bool``/``float``/
  ``int`` of a tensor) and counts the calls made from outside torch's own package: the
  places that would wait on a GPU. Reads inside torch (e.g. Adam's step count, which lives
  on the host even on a GPU) and syncs made in C++ (a mask index) are not seen on a CPU;
  the CUDA mode is the complete one.

The counter is only installed while ``--count-syncs`` is on, and only around steps; the
timings are always taken (three clock reads per step).
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any, Iterator

import torch

#: The tensor methods that hand a value to the host (the CPU counter wraps these).
READERS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")
_TORCH_DIR = str(Path(torch.__file__).parent)
_CUDA_SYNC_WARNING = "synchronizing CUDA operation"


class _TensorReads:
    """Counts calls of :data:`READERS` made from code outside torch, by caller line."""

    def __init__(self) -> None:
        self.where: Counter[str] = Counter()
        self.active = True  # off while the loader works on host tensors (see SyncCounter)
        self._saved: dict[str, Any] = {}

    def install(self) -> None:
        for name in READERS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counting(original))

    def uninstall(self) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _counting(self, original):
        where = self.where

        def read(tensor, *args, **kwargs):
            if self.active:
                caller = sys._getframe(1)
                path = caller.f_code.co_filename
                if not path.startswith(_TORCH_DIR):
                    where[f"{_short(path)}:{caller.f_lineno}"] += 1
            return original(tensor, *args, **kwargs)

        read.__name__ = getattr(original, "__name__", "read")
        return read


def _short(path: str) -> str:
    """A caller's file as people find it: from the package directory on (``ddl/...``,
    ``ddl_mnist/...``), else the file name."""
    parts = Path(path).parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("site-packages", "src"):
            return "/".join(parts[i + 1:])
    return parts[-1] if parts else path


class SyncCounter:
    """Host-device synchronisations made inside ``counting()`` blocks, by caller line.

    ``loading(True)`` marks the part of a step where the data loader runs: its data sets
    read their own host tensors (``int(targets[i])``), which no GPU waits for, so the CPU
    counter pauses there; the CUDA mode goes on counting (a blocking copy to the device
    while batches are moved is a sync worth seeing)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.mode = "cuda sync debug mode" if device.type == "cuda" else "tensor reads"
        self._reads = _TensorReads() if device.type != "cuda" else None
        self.where: Counter[str] = Counter()

    @contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        """Count the block's syncs; yields a Counter filled when the block ends."""
        found: Counter[str] = Counter()
        if self._reads is not None:
            self._reads.where = found
            self._reads.install()
            try:
                yield found
            finally:
                self._reads.uninstall()
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                previous = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield found
                finally:
                    torch.cuda.set_sync_debug_mode(previous)
            for w in caught:
                if _CUDA_SYNC_WARNING in str(w.message):
                    found[f"{_short(w.filename)}:{w.lineno}"] += 1
                else:  # not ours: shown as it would have been
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        self.where.update(found)

    def loading(self, on: bool) -> None:
        if self._reads is not None:
            self._reads.active = not on


class StepBreakdown:
    """One epoch's per-step split of rank 0's host time, and (``count_syncs``) its syncs.

    The trainer calls ``started``, ``fetched`` (batches on the device), ``stepped`` (the
    strategy's step returned) and ``ended(asked)`` around each step, ``asked`` naming the
    flag that reads a device value at this step (None when none does). The first step of
    an epoch (loader start-up, lazy initialisation) is left out of the means."""

    def __init__(self, device: torch.device, count_syncs: bool) -> None:
        self.syncs = SyncCounter(device) if count_syncs else None
        self._t: list[float] = []
        self._sums = {"data_wait_s": 0.0, "strategy_s": 0.0, "ddl_s": 0.0, "step_s": 0.0}
        self._steps = 0
        self._seen = 0
        self.unrequested: Counter[str] = Counter()  # syncs at steps no flag asked to read
        self.requested: Counter[str] = Counter()  # flag: syncs at steps a flag asked to
        self.requested_at: Counter[str] = Counter()  # where those were made

    @contextmanager
    def step(self) -> Iterator[Counter[str]]:
        """Around one whole step (fetch to guard); counts its syncs when asked to."""
        if self.syncs is None:
            yield Counter()
            return
        with self.syncs.counting() as found:
            yield found

    def started(self) -> None:
        self._t = [perf_counter()]
        if self.syncs is not None:
            self.syncs.loading(True)

    def fetched(self) -> None:
        self._t.append(perf_counter())
        if self.syncs is not None:
            self.syncs.loading(False)

    def stepped(self) -> None:
        self._t.append(perf_counter())

    def ended(self, asked: str | None, syncs: Counter[str]) -> None:
        end = perf_counter()
        self._seen += 1
        if self._seen == 1:  # the epoch's first step: one-off costs
            return
        begin, fetched, stepped = self._t
        self._steps += 1
        self._sums["data_wait_s"] += fetched - begin
        self._sums["strategy_s"] += stepped - fetched
        self._sums["ddl_s"] += end - stepped
        self._sums["step_s"] += end - begin
        if syncs:
            if asked:
                self.requested[asked] += sum(syncs.values())
                self.requested_at.update(syncs)
            else:
                self.unrequested.update(syncs)

    def record(self) -> dict[str, Any]:
        """The epoch's breakdown, for metrics.jsonl and results.json (rank 0's)."""
        n = max(self._steps, 1)
        out: dict[str, Any] = {"steps": self._steps,
                               "per_step": {k: v / n for k, v in self._sums.items()}}
        step = self._sums["step_s"]
        out["ddl_share"] = self._sums["ddl_s"] / step if step else None
        if self.syncs is not None:
            out["syncs"] = {
                "counted_by": self.syncs.mode,
                "unrequested": sum(self.unrequested.values()),
                "unrequested_where": dict(self.unrequested.most_common(10)),
                "requested": dict(self.requested),
                "requested_where": dict(self.requested_at.most_common(10)),
                "per_step": sum(self.unrequested.values()) / n}
        return out
