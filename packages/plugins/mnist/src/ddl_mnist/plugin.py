"""Registration of the MNIST workload (no torch import here: listing must stay fast)."""

from ddl.contract.hookspecs import hook_returning
from ddl.contract.specs import Preset, WorkloadSpec

PRESETS = {
    "course": Preset(
        name="course",
        summary="the BSC course: 32/64-channel CNN, 5 epochs, batch 100",
        epochs=5, batch_size=100, lr=1e-3, options={"channels": (32, 64)},
    ),
    # the GPU check kit trains it at the largest batch that fits ~80 % of the GPU
    # (--batch-size from its batch search); 4096 where none was searched
    "throughput": Preset(
        name="throughput",
        summary="to fill a GPU: the course's CNN and Adam lr, batch 4096",
        epochs=5, batch_size=4096, lr=1e-3, options={"channels": (32, 64)},
    ),
    "tiny": Preset(
        name="tiny",
        summary="for CPU tests: 8/16 channels, 2000 training samples, 2 epochs",
        epochs=2, batch_size=32, lr=2e-3,
        options={"channels": (8, 16), "train_samples": 2000, "eval_samples": 500},
    ),
}


# the hook ddl calls to list the workloads of this plugin
ddl_register_workloads = hook_returning(WorkloadSpec(
    name="mnist", factory="ddl_mnist.workload:MnistWorkload",
    summary="MNIST digits, CNN of the BSC CTE-POWER course (conv 5x5 x2, dense 10)",
    presets=PRESETS, default_preset="course",
    contract="2",  # the contract major it is built against (ddl.contract.CONTRACT_VERSION)
    capabilities=frozenset({"fsdp_units", "pipeline_splits"})))
