"""Build the workload's model the way the strategy wants it: on the meta device (each rank
later allocates only what it keeps) or whole on the CPU; and load pretrained weights.

On meta: ``deferred_init.record`` runs the workload's ``build_model`` on the meta device and
logs it; the strategy shards or splits the meta model and calls the returned
``Materializer`` on what the rank keeps (ddl.worker.materialize). The values equal those a
plain build draws with the same seed, so every layout starts from one process's weights.
A build the recording cannot replay (a workload that reads values while building, or uses
its own random generator) is built whole instead, with a one-line note.
"""

from __future__ import annotations

import torch
from torch import nn

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy, StrategyContext
from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl.worker import deferred_init, materialize
from ddl.worker.weights_file import WeightsFile


def build(workload: Workload, strategy: Strategy, run: StrategyContext, world: World
          ) -> tuple[nn.Module, materialize.Materializer | None]:
    weights = _weights(workload)
    if strategy.builds_on_meta(run):
        try:
            model, recording = deferred_init.record(workload.build_model)
        except UsageError:  # the workload's own message (DataError too): as it is
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: the plain build still works
            if world.rank == 0:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                print(f"ddl: note: {type(workload).__name__} cannot be built on the meta device "
                      f"({reason[:160]}); every rank builds the whole model first",
                      flush=True)
        else:
            refs = materialize.refs_of(model, recording)
            return model, materialize.Materializer(recording, refs, world.device, weights)
    model = workload.build_model()
    if weights is not None:
        materialize.load_weights(model, weights)
    return model, None


def _weights(workload: Workload) -> WeightsFile | None:
    directory = workload.pretrained_weights()
    return WeightsFile(directory) if directory is not None else None


def check_materialized(model: nn.Module, strategy: Strategy) -> None:
    """A strategy that said it builds on meta but left tensors there fails here, by name,
    not in the first forward."""
    left = materialize.meta_tensors(model)
    if left:
        raise RuntimeError(f"strategy {strategy.name!r} left {len(left)} tensors on the meta "
                           f"device (first: {left[0]}): its wrap must call "
                           "run.materialize on each part it keeps")
