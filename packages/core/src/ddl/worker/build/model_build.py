"""Build the workload's model the way the strategy wants it: on the meta device (each rank
later allocates only what it keeps) or whole on the CPU; and load pretrained weights.

On meta: ``deferred_init.record`` runs the workload's ``build_model`` on the meta device and
logs it; the strategy shards or splits the meta model and calls the returned
``Materializer`` on what the rank keeps (ddl.worker.build.materialize). The values equal those a
plain build draws with the same seed, so every layout starts from one process's weights.
A build the recording cannot replay exactly (ddl.worker.build.deferred_init lists what it refuses:
values read while building, its own random generator, a reseed, a draw on a CPU tensor, a
tensor nothing wrote) is built whole instead, with one ``ddl: note:`` line naming the tensor
or the place in the build and the reason.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy, StrategyContext
from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl.worker.build import deferred_init, materialize
from ddl.worker.build.weights_file import WeightsFile


def build(workload: Workload, strategy: Strategy, run: StrategyContext, world: World
          ) -> tuple[nn.Module, materialize.Materializer | None]:
    weights = _weights(workload)
    if strategy.builds_on_meta(run):
        recorded = record_or_reason(workload.build_model)
        if isinstance(recorded, str):
            if world.rank == 0:
                print(f"ddl: note: {type(workload).__name__} cannot be built on the meta device "
                      f"({recorded}); every rank builds the whole model first", flush=True)
        else:
            model, recording = recorded
            refs = materialize.refs_of(model, recording)
            return model, materialize.Materializer(recording, refs, world.device, weights)
    model = workload.build_model()
    if weights is not None:
        materialize.load_weights(model, weights)
    return model, None


def record_or_reason(build: Callable[[], nn.Module]
                     ) -> tuple[nn.Module, deferred_init.Recording] | str:
    """The meta build and its recording, or why ddl builds the plain way instead (one
    line: what the build did and where). A workload's own UsageError (DataError too)
    passes as it is: the plain build would raise it as well."""
    try:
        return deferred_init.record(build)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure: the plain build still works
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return reason if len(reason) <= 200 else reason[:197] + "..."


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
