"""In steady state a training step makes no host-device synchronisation that no flag asked
for (issue 38): ``--count-syncs`` counts the reads of device values in every step on rank 0
(ddl.worker.observe.step_breakdown; on a CPU the Python entry points that read a tensor, on CUDA
torch's sync debug mode, which the GPU kit runs). The runs here: MNIST under DDP with
gradient clipping and a progress line every 3 steps (its reads must be counted, and
attributed to --log-every), T5 tiny under FSDP with clipping and under the pipeline.
Syncs torch makes in C++ (a mask index) are invisible on a CPU: the GPU kit's CUDA mode
covers those. Runs use the session's rank pools (tests/pool_train.py), and evaluate the first
8 val and test samples only (`--eval-samples`): the counts are of the training steps, which
the evaluation after them cannot change (T5's full splits were 48 articles of generation each)."""

import pytest

from pool_train import prepare, train_cell

pytestmark = pytest.mark.distributed

STEPS = ["--preset", "tiny", "--epochs", "1", "--steps-per-epoch", "7", "--seed", "7",
         "--count-syncs", "--check-every", "1000", "--eval-samples", "8"]


def _breakdown(pools, tmp_path, args, nproc=2):
    plan = prepare([*STEPS, *args], tmp_path / "run", nproc)
    rank0 = pools[nproc].run(train_cell, plan, timeout_s=300)[0]
    return rank0["results"]["step_breakdown"]


def test_ddp_with_clipping_syncs_only_for_the_progress_line(tmp_path, synthetic_mnist,
                                                            rank_pools):
    got = _breakdown(rank_pools, tmp_path, [
        "--plugin", "mnist", "--strategy", "ddp", "--clip-grad-norm", "1.0",
        "--log-every", "3", "--data-dir", str(synthetic_mnist)])
    syncs = got["syncs"]
    assert syncs["unrequested"] == 0, syncs["unrequested_where"]
    # steps 3 and 6 print the loss (step 1, the epoch's first, is not measured)
    assert syncs["requested"]["--log-every"] == 2, syncs
    assert any(where.startswith("ddl/worker/observe/progress.py:") for where in
               syncs["requested_where"]), syncs
    assert got["steps"] == 6
    assert 0 < got["per_step"]["ddl_s"] < got["per_step"]["step_s"]


@pytest.mark.parametrize("strategy", ["fsdp", "pp"])
def test_t5_steps_make_no_unrequested_sync(tmp_path, synthetic_xsum, rank_pools, strategy):
    got = _breakdown(rank_pools, tmp_path, [
        "--plugin", "xsum", "--strategy", strategy, "--global-batch-size", "8",
        "--clip-grad-norm", "0.5", "--log-every", "1000", "--data-dir", str(synthetic_xsum)])
    assert got["syncs"]["unrequested"] == 0, got["syncs"]["unrequested_where"]
