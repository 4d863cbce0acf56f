"""Registration of the CIFAR-10 workload (no torch import here: listing must stay fast)."""

from ddl.contract.hookspecs import hook_returning
from ddl.contract.specs import Preset, WorkloadSpec

# The course (BSC CTE-POWER, ResNet50.py / ResNet50.sh): Keras ResNet50V2, 128x128 input,
# SGD lr 0.01 x n_gpus, batch 256 per GPU (256 / 512 / 1024 on 1 / 2 / 4 GPUs), 5 epochs.
# Its lr rule is ddl's `--lr-scaling linear` with the per-replica batch of 256 here.
_COURSE = {"image_size": 128, "blocks": (3, 4, 6, 3), "filters": (64, 128, 256, 512),
           "stem": 64, "bn_momentum": 0.01}

PRESETS = {
    "course": Preset(
        name="course",
        summary="the BSC course: ResNet50 v2, 128 px, SGD lr 0.01, batch 256, 5 epochs",
        epochs=5, batch_size=256, lr=0.01, options=_COURSE,
    ),
    "resnet152": Preset(
        name="resnet152",
        summary="the course's bonus: ResNet152 v2 (blocks 3-8-36-3), otherwise as course",
        epochs=5, batch_size=256, lr=0.01, options={**_COURSE, "blocks": (3, 8, 36, 3)},
    ),
    # the GPU check kit trains it at the largest batch that fits ~80 % of the GPU
    # (--batch-size from its batch search); 2048 where none was searched
    "throughput": Preset(
        name="throughput",
        summary="to fill a GPU: the course's ResNet50 v2, batch 2048, lr 0.08 (its linear rule)",
        epochs=5, batch_size=2048, lr=0.08, options=_COURSE,
    ),
    "tiny": Preset(
        name="tiny",
        summary="for CPU tests: 32 px, widths /8, one block per stage, 4500 samples, 8 epochs",
        epochs=8, batch_size=32, lr=0.1,
        options={"image_size": 32, "blocks": (1, 1, 1, 1), "filters": (8, 16, 32, 64),
                 "stem": 8, "bn_momentum": 0.1,
                 "train_samples": 4500, "eval_samples": 500},
    ),
}
# tiny with BatchNorm statistics per fixed group of 8 samples (ddl.contract.batchnorm's
# GhostBatchNorm2d): a pipeline's microbatches of 8, 16, ... samples are then normalised as
# in one process. (Over data-parallel ranks the same is `--preset tiny --sync-bn`.)
PRESETS["tiny-ghostbn"] = Preset(
    name="tiny-ghostbn", summary="tiny with BatchNorm over fixed groups of 8 samples (pipelines)",
    epochs=PRESETS["tiny"].epochs, batch_size=PRESETS["tiny"].batch_size, lr=PRESETS["tiny"].lr,
    options={**PRESETS["tiny"].options, "bn_group": 8})


# the hook ddl calls to list the workloads of this plugin
ddl_register_workloads = hook_returning(WorkloadSpec(
    name="cifar", factory="ddl_cifar.workload:CifarWorkload",
    summary="CIFAR-10, ResNet50 v2 (pre-activation) of the BSC CTE-POWER course",
    presets=PRESETS, default_preset="course",
    contract="2",  # the contract major it is built against (ddl.contract.CONTRACT_VERSION)
    capabilities=frozenset({"fsdp_units", "pipeline_splits"})))
