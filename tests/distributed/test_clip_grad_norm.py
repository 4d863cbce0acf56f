"""--clip-grad-norm clips by the whole model's gradient norm under every strategy: the norm
each run records (before clipping) and the weights after 3 steps equal one process's.

T5 tiny (xsum) on 2 processes under fsdp (DTensor shards), tp (DTensor shards and
replicated plain tensors) and pp (stages on different ranks, the tied embedding on two of
them). The norm is compared directly: AdamW is nearly invariant to a gradient's scale, so a
wrong norm would hardly show in the weights alone. The limit (0.5) is below the norm
(~1.6 at the start), so every step is clipped. The runs use the session's rank pools
(tests/pool_train.py: the worker's own trainer, no process start per run).
"""

import pytest

from conftest import assert_same_weights
from pool_train import prepare, train_cell

pytestmark = pytest.mark.distributed

CLIP = ["--plugin", "xsum", "--preset", "tiny", "--global-batch-size", "16",
        "--epochs", "1", "--steps-per-epoch", "3", "--seed", "7", "--clip-grad-norm", "0.5"]


def _train(pools, tmp_path, data_dir, nproc, strategy):
    plan = prepare([*CLIP, "--strategy", strategy, "--data-dir", str(data_dir)],
                   tmp_path / f"{strategy}-{nproc}", nproc)
    rank0 = pools[nproc].run(train_cell, plan, timeout_s=300)[0]
    return rank0["results"], rank0["model"]


@pytest.fixture(scope="module")
def single(tmp_path_factory, synthetic_xsum, rank_pools):
    return _train(rank_pools, tmp_path_factory.mktemp("ref"), synthetic_xsum, 1, "ddp")


@pytest.mark.parametrize("strategy", ["fsdp", "tp", "pp"])
def test_clipped_by_the_global_norm(tmp_path, synthetic_xsum, single, rank_pools, strategy):
    ref_results, ref = single
    want = ref_results["epochs"][0]["grad_norm"]
    assert want > 0.5  # the limit binds
    results, weights = _train(rank_pools, tmp_path, synthetic_xsum, 2, strategy)
    assert results["epochs"][0]["grad_norm"] == pytest.approx(want, rel=1e-4)
    assert_same_weights(weights, ref, adam=True)
