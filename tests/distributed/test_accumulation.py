"""Gradient accumulation (issue 22): `--batch-size B --global-batch-size G` on a
data-parallel degree D runs G / (B x D) micro-steps per optimizer step, and those micro-steps
end where one step of the same global batch ends.

Every run is a `ddl train` run plan on a rank pool (tests/pool_train.py), 3 optimizer steps
at a global batch of 32 (MNIST, SGD: compared element by element) or 16 (xsum, AdamW:
per tensor), against one process taking whole steps (no accumulation). Each micro-step's
loss is divided by their number, so the summed gradients are those of the mean loss over
the global batch, up to float rounding; replicas synchronise on the last micro-step only
(DDP's no_sync, FSDP2's set_requires_gradient_sync). The 3-D mesh with accumulation is
test_layout_3d.py's 8-rank run. Impossible combinations are refused before any worker
starts (the CLI's pre-flight): one line, exit 2.
"""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, assert_same_weights, run_ddl
from pool_train import MNIST_3_STEPS as MNIST
from pool_train import XSUM_3_STEPS as XSUM
from pool_train import run_on_pool as _run

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def mnist_whole_steps(tmp_path_factory, synthetic_mnist, rank_pools):
    return _run(rank_pools, tmp_path_factory.mktemp("mnist-one") / "run", 1,
                [*MNIST, "--data-dir", str(synthetic_mnist)])


# (processes, extra arguments, micro-batch per replica, micro-steps per optimizer step)
MNIST_CELLS = {
    "one-process": (1, ["--batch-size", "8"], 8, 4),
    "ddp": (2, ["--batch-size", "8"], 8, 2),
    "fsdp": (2, ["--strategy", "fsdp", "--batch-size", "4"], 4, 4),
    "pp": (2, ["--strategy", "pp", "--batch-size", "8", "--microbatches", "2"], 8, 4),
    "hsdp": (4, ["--mesh", "dp_replicate=2,dp_shard=2", "--batch-size", "4"], 4, 2),
}


@pytest.mark.parametrize("cell", list(MNIST_CELLS))
def test_micro_steps_equal_whole_steps_mnist(cell, tmp_path, synthetic_mnist, rank_pools,
                                             mnist_whole_steps):
    nproc, extra, micro, steps = MNIST_CELLS[cell]
    results, weights = _run(rank_pools, tmp_path / "run", nproc,
                            [*MNIST, *extra, "--data-dir", str(synthetic_mnist)])
    assert results["batch"]["micro"] == micro and results["batch"]["global"] == 32
    assert results["batch"]["accumulation_steps"] == steps
    assert results["steps_per_epoch"] == 3
    ref_results, ref = mnist_whole_steps
    assert ref_results["batch"]["accumulation_steps"] == 1
    assert_same_weights(weights, ref)
    # the epoch's training metrics average every micro-batch's samples
    assert results["epochs"][0]["train"]["loss"] == pytest.approx(
        ref_results["epochs"][0]["train"]["loss"], rel=1e-5)


def test_tensor_parallel_micro_steps_equal_whole_steps_xsum(tmp_path, synthetic_xsum,
                                                            rank_pools):
    data = ["--data-dir", str(synthetic_xsum)]
    _, ref = _run(rank_pools, tmp_path / "one", 1, [*XSUM, *data])
    results, weights = _run(rank_pools, tmp_path / "tp", 2,
                            [*XSUM, *data, "--strategy", "tp", "--batch-size", "4"])
    assert results["batch"]["accumulation_steps"] == 4  # tp: one replica of 16 in 4 x 4
    assert_same_weights(weights, ref, adam=True)


@pytest.mark.parametrize("args, needles", [
    (["--nproc", "2", "--batch-size", "8", "--global-batch-size", "24"],
     ["--global-batch-size: 24 is not a multiple of --batch-size 8 x 2", "multiples of 16"]),
    (["--nproc", "2", "--strategy", "accelerate", "--batch-size", "4",
      "--global-batch-size", "16"], ["accelerate", "2 accumulated micro-steps", "allowed:"]),
    (["--nproc", "2", "--strategy", "pp", "--batch-size", "6", "--global-batch-size", "12",
      "--microbatches", "4"], ["--microbatches: 4 does not divide", "6 per forward pass"]),
])
def test_impossible_accumulation_is_refused_before_workers_start(tmp_path, synthetic_mnist,
                                                                 args, needles):
    run_dir = tmp_path / "run"
    proc = run_ddl("train", "--plugin", "mnist", "--preset", "tiny", *args, "--data-dir",
                   str(synthetic_mnist), "--run-dir", str(run_dir), cwd=tmp_path)
    assert_one_line_error(proc, *needles)
    assert not run_dir.exists()
