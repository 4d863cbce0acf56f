"""Registration: what `ddl plugins` lists. No torch import here, listing must stay fast."""

from ddl.contract.hookspecs import hookimpl
from ddl.contract.specs import Preset, WorkloadSpec

PRESETS = {
    "standard": Preset(
        name="standard",
        summary="64-wide MLP, 20000 training rows, 10 epochs, batch 64",
        epochs=10, batch_size=64, lr=1e-3,
        options={"width": 64, "train_rows": 20000, "eval_rows": 2000},
    ),
    "tiny": Preset(
        name="tiny",
        summary="for CPU tests: 16-wide MLP, 512 training rows, 2 epochs",
        epochs=2, batch_size=16, lr=1e-2,
        options={"width": 16, "train_rows": 512, "eval_rows": 128},
    ),
}


@hookimpl
def ddl_register_workloads():
    return [
        WorkloadSpec(
            name="example",
            summary="example plugin: MLP regression on generated tabular data (CSV files)",
            factory="ddl_example.workload:RegressionWorkload",
            presets=PRESETS,
            default_preset="standard",
            contract="2",  # the contract major it is built against
            # fsdp_units: FSDP shards each hidden block on its own. Every strategy without
            # requirements (ddp, fsdp, accelerate) trains it; pp/tp need hints it lacks.
            capabilities=frozenset({"fsdp_units"}),
        ),
    ]
