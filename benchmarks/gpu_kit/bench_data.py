"""The kit's bench copy of a workload's synthetic data: the same generator as
``ddl prepare --synthetic`` (the plugin's ``write_synthetic``, so the same on-disk format),
with sizes for measuring rather than for CI. On a GPU the training splits are large enough
that the throughput checks' batches of thousands still make at least 8 steps per epoch
(MNIST and CIFAR-10 at their real sizes); XSum's test split is cut to 32 articles, because
ddl's course run ends with ROUGE on generated summaries, which would otherwise take most of
each round against the peer and is not what a round measures."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

# keyword arguments of each plugin's write_synthetic (their signatures differ)
SIZES = {
    True: {"mnist": {"train_size": 60000}, "cifar": {"train_size": 50000},
           "imagewoof": {"train_per_class": 500},
           "xsum": {"sizes": {"train": 8000, "validation": 300, "test": 32}}},
    False: {"mnist": {"train_size": 4000}, "cifar": {"train_size": 2000},
            "imagewoof": {"train_per_class": 40},
            "xsum": {"sizes": {"train": 600, "validation": 64, "test": 16}}},
}


def write(plugin: str, data_dir: str, gpu: bool) -> dict:
    from ddl.contract.plugins import Plugins

    spec = Plugins().workload(plugin)
    workload = spec.create(spec.presets[spec.default_preset])
    sizes = SIZES[gpu][plugin]
    where = import_module(workload.synthetic_module).write_synthetic(Path(data_dir), **sizes)
    return {"plugin": plugin, "written": str(where),
            **{k: str(v) for k, v in sizes.items()}}
