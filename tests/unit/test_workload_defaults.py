"""The Workload contract's defaults: data methods delegating to the modules a workload
names, and the held-out validation split of MNIST and CIFAR-10."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddl.contract.errors import DataError, DataMissing
from ddl.contract.specs import Preset
from ddl.contract.workload import Workload
from ddl_mnist.plugin import PRESETS as MNIST_PRESETS
from ddl_mnist.workload import MnistWorkload

pytestmark = pytest.mark.unit


class Bare(Workload):
    """Names no data module and overrides nothing."""

    datasets = build_model = loss = sample_metrics = optimizer = None


def preset(**options) -> Preset:
    return Preset(name="t", summary="", epochs=1, batch_size=1, lr=0.1, options=options)


def test_data_methods_delegate_to_the_named_modules(tmp_path):
    workload = MnistWorkload(MNIST_PRESETS["tiny"])
    with pytest.raises(DataMissing, match="ddl prepare --plugin mnist"):
        workload.check_data(tmp_path)
    assert not workload.is_synthetic(tmp_path)
    from ddl_mnist import synthetic

    synthetic.write_synthetic(tmp_path, train_size=20, test_size=10, seed=0)
    workload.check_data(tmp_path)  # data.check_files accepts what synthetic wrote
    assert workload.is_synthetic(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"")
    with pytest.raises(DataError, match="t10k-labels"):
        workload.check_data(tmp_path)


def test_a_workload_without_data_module_says_what_to_set(tmp_path: Path):
    bare = Bare(preset())
    assert bare.is_synthetic(tmp_path) is False
    with pytest.raises(TypeError, match="Bare sets no data_module"):
        bare.check_data(tmp_path)
    with pytest.raises(TypeError, match="Bare sets no synthetic_module"):
        bare.prepare(tmp_path, synthetic=True)


def test_holdout_splits_hold_out_the_tail_and_cut_prefixes():
    train, test = list(range(100)), list(range(1000, 1030))
    splits = Bare(preset()).holdout_splits(train, test, 0.1)
    assert [list(splits[s]) for s in ("train", "val", "test")] == \
        [list(range(90)), list(range(90, 100)), test]
    view = [f"eval {i}" for i in range(100)]
    cut = Bare(preset(train_samples=3, eval_samples=2)).holdout_splits(train, test, 0.1,
                                                                       val_view=view)
    assert list(cut["train"]) == [0, 1, 2]
    assert list(cut["val"]) == ["eval 90", "eval 91"]
    assert list(cut["test"]) == [1000, 1001]


def test_derived_metrics_come_from_the_exact_means():
    """A metric derived from the reduced means (xsum's perplexity = exp of the mean loss)
    is added beside them; a mean of per-sample perplexities would be larger."""
    import math

    from ddl.contract.plugins import Plugins
    from ddl.worker.train.evaluation import with_derived

    spec = Plugins().workload("xsum")
    xsum = spec.create(spec.presets["tiny"])
    got = with_derived({"loss": 2.0, "token_accuracy": 0.5}, xsum)
    assert got == {"loss": 2.0, "token_accuracy": 0.5, "perplexity": math.exp(2.0)}
    mnist = Plugins().workload("mnist")
    assert with_derived({"loss": 2.0}, mnist.create(mnist.presets["tiny"])) == {"loss": 2.0}
