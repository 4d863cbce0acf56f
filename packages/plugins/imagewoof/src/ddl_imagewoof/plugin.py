"""Registration of the Imagewoof workload (no torch import here: listing must stay fast)."""

from ddl.hookspecs import hookimpl
from ddl.specs import Preset, WorkloadSpec

PRESETS = {
    "course": Preset(
        name="course",
        summary="the JSC talk (fastai distrib.py): xresnet50, 160 px crops, 6 epochs, batch 64",
        epochs=6, batch_size=64, lr=1e-3, options={"image_size": 160},
    ),
    "tiny": Preset(
        name="tiny",
        summary="for CPU tests: xresnet at 1/4 width with one block per stage, 64 px crops, "
                "at most 900 training images, 3 epochs",
        epochs=3, batch_size=32, lr=2e-3,
        options={"image_size": 64, "width_divisor": 4, "layers": (1, 1, 1, 1),
                 "train_samples": 900, "eval_samples": 300},
    ),
}


@hookimpl
def ddl_register_workloads():
    return [
        WorkloadSpec(
            name="imagewoof",
            summary="Imagewoof 320 px (10 dog breeds), fastai-style xresnet50 of the JSC talk",
            factory="ddl_imagewoof.workload:ImagewoofWorkload",
            presets=PRESETS,
            default_preset="course",
            capabilities=frozenset({"fsdp_units", "pipeline_splits"}),
        ),
    ]
