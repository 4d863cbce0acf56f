"""Registration: what `ddl plugins` lists. No torch import here: listing must stay fast."""

from ddl.contract.hookspecs import hookimpl
from ddl.contract.specs import Preset, WorkloadSpec

PRESETS = {
    "standard": Preset(
        name="standard",
        summary="4 blocks, d_model 64, 4 heads, context 64, 200k training characters",
        epochs=5, batch_size=32, lr=3e-3,
        options={"blocks": 4, "d_model": 64, "heads": 4, "context": 64,
                 "train_chars": 200_000, "eval_chars": 20_000},
    ),
    "wide": Preset(
        name="wide",
        summary="for the meta-device build check: 8 blocks, d_model 1024 (~100M parameters, "
                "400 MB in fp32), 16 heads, context 32",
        epochs=1, batch_size=8, lr=3e-4,
        options={"blocks": 8, "d_model": 1024, "heads": 16, "context": 32,
                 "train_chars": 8_000, "eval_chars": 1_600},
    ),
    "tiny": Preset(
        name="tiny",
        summary="for CPU tests: 2 blocks, d_model 32, 4 heads, context 16",
        epochs=2, batch_size=8, lr=3e-3,
        options={"blocks": 2, "d_model": 32, "heads": 4, "context": 16,
                 "train_chars": 8_000, "eval_chars": 1_600},
    ),
}


@hookimpl
def ddl_register_workloads():
    return [
        WorkloadSpec(
            name="chargpt",
            summary="example plugin: small GPT (tied head) on a generated character corpus",
            factory="ddl_gpt.workload:GptWorkload",
            presets=PRESETS,
            default_preset="standard",
            contract="2",  # the contract major it is built against
            # every hint: fsdp, tp, fsdp+tp, pp and --mesh layouts all train it
            capabilities=frozenset({"fsdp_units", "tp_plan", "pipeline_splits"}),
        ),
    ]
