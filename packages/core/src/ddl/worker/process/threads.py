"""How many CPU threads this rank computes with: set as the run plan says, and reported.

The number is decided in the pre-flight by one rule for every launcher (ddl.settings.cores,
the run plan's ``cores``); ddl.worker.process.cpu_binding hands this rank's to
:func:`apply`. results.json records it (``threads``).
"""

from __future__ import annotations

import os

from ddl.settings.cores import Threads

_chosen: Threads | None = None


def apply(chosen: Threads) -> None:
    """Set torch's intra-op threads (and OMP_NUM_THREADS for what this process starts)."""
    import torch

    global _chosen
    _chosen = chosen
    torch.set_num_threads(chosen.per_rank)
    os.environ["OMP_NUM_THREADS"] = str(chosen.per_rank)


def report() -> dict[str, object]:
    """results.json's ``threads``: the plan's choice, or torch's own count where ddl's
    worker entry did not set it (an embedding application, the test suite's rank pools)."""
    if _chosen is not None:
        return _chosen.model_dump()
    import torch

    return {"per_rank": torch.get_num_threads(), "source": "not set by ddl (embedded run)"}
