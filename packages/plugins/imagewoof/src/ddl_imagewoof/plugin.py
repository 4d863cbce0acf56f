"""Registration of the Imagewoof workload (no torch import here: listing must stay fast)."""

from ddl.contract.hookspecs import hook_returning
from ddl.contract.specs import Preset, WorkloadSpec

PRESETS = {
    "course": Preset(
        name="course",
        summary="the JSC talk (fastai distrib.py): xresnet50, 160 px crops, 6 epochs, batch 64",
        epochs=6, batch_size=64, lr=1e-3, options={"image_size": 160},
    ),
    # the GPU check kit trains it at the largest batch that fits ~80 % of the GPU
    # (--batch-size from its batch search); 512 where none was searched
    "throughput": Preset(
        name="throughput",
        summary="to fill a GPU: the course's xresnet50 at 160 px and its lr, batch 512",
        epochs=6, batch_size=512, lr=1e-3, options={"image_size": 160},
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
# tiny made comparable across layouts, for the equivalence tests: no random augmentation
# (crops would come from each rank's own random stream) and fewer evaluation images. BatchNorm
# must not depend on how the batch is cut either: over data-parallel ranks that is
# `--preset tiny-exact --sync-bn`; for pipelines tiny-ghostbn takes statistics over fixed
# groups of 8 samples (ddl.contract.batchnorm).
# lr 5e-4: at tiny's 2e-3, 3 AdamW steps grow the rounding of a different summation order
# (N ranks' gradient sums vs one) to 1e-3 in some weights; at 5e-4 it stays below 1e-6.
_EXACT = {**PRESETS["tiny"].options, "augment": False, "eval_samples": 100}
for _name, _bn, _what in [("tiny-exact", {}, "plain BatchNorm"),
                          ("tiny-ghostbn", {"batchnorm": "ghost", "bn_group": 8},
                           "BatchNorm over fixed groups of 8 samples (pipelines)")]:
    PRESETS[_name] = Preset(
        name=_name, summary=f"tiny without random augmentation, 100 evaluation images, {_what}",
        epochs=PRESETS["tiny"].epochs, batch_size=PRESETS["tiny"].batch_size,
        lr=5e-4, options={**_EXACT, **_bn})


# the hook ddl calls to list the workloads of this plugin
ddl_register_workloads = hook_returning(WorkloadSpec(
    name="imagewoof", factory="ddl_imagewoof.workload:ImagewoofWorkload",
    summary="Imagewoof 320 px (10 dog breeds), fastai-style xresnet50 of the JSC talk",
    presets=PRESETS, default_preset="course",
    contract="2",  # the contract major it is built against (ddl.contract.CONTRACT_VERSION)
    capabilities=frozenset({"fsdp_units", "pipeline_splits"})))
