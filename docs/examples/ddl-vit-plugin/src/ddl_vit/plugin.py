"""Registration: what `ddl plugins` lists. No torch import here: listing must stay fast."""

from ddl.contract.hookspecs import hookimpl
from ddl.contract.specs import Preset, WorkloadSpec

PRESETS = {
    "standard": Preset(
        name="standard",
        summary="32x32 images, patch 4, 6 blocks, d_model 128, 8 heads, 8000 training images",
        epochs=10, batch_size=64, lr=1e-3,
        options={"image_size": 32, "patch": 4, "d_model": 128, "heads": 8, "blocks": 6,
                 "train_images": 8000, "eval_images": 1000},
    ),
    "tiny": Preset(
        name="tiny",
        summary="for CPU tests: 16x16 images, patch 4, 4 blocks, d_model 32, 4 heads",
        epochs=2, batch_size=8, lr=1e-3,
        options={"image_size": 16, "patch": 4, "d_model": 32, "heads": 4, "blocks": 4,
                 "train_images": 320, "eval_images": 64},
    ),
}


@hookimpl
def ddl_register_workloads():
    return [
        WorkloadSpec(
            name="vit",
            summary="example plugin: small Vision Transformer on generated images",
            factory="ddl_vit.workload:VitWorkload",
            presets=PRESETS,
            default_preset="standard",
            contract="2",  # the contract major it is built against
            # every hint: fsdp, tp, fsdp+tp, pp and --mesh layouts all train it
            capabilities=frozenset({"fsdp_units", "tp_plan", "pipeline_splits"}),
        ),
    ]
