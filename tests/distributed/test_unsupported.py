"""Unsupported combinations stop before training with one line naming what is allowed."""

import pytest

from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("args, needles", [
    (["--strategy", "pp", "--nproc", "1"], ["--strategy pp", "at least 2 processes"]),
    (["--strategy", "pp", "--nproc", "2", "--microbatches", "8", "--strategy-option",
      "schedule=interleaved1f1b", "--strategy-option", "stages_per_rank=3"],
     ["6 pipeline stages need 5 split points", "at most 4 stages"]),  # MNIST: 4 children
    (["--strategy", "pp", "--nproc", "4", "--mesh", "dp=3"],
     ["--mesh: dp_replicate=3 does not divide the world of 4 processes", "divides 4"]),
    (["--strategy", "ddp", "--nproc", "2", "--mesh", "dp=2,pp=2"],  # would be ignored
     ["--mesh: ddp has no dimension 'dp'", "allowed: none"]),
    (["--nproc", "4", "--mesh", "pp=2,dp_replicate=2,dp_shard=2"],  # --mesh alone: "mesh"
     ["--mesh: pp=2 x dp_replicate=2 x dp_shard=2 = 8 processes", "the world has 4"]),
    (["--nproc", "2", "--mesh", "pq=2"],
     ["--mesh: mesh has no dimension 'pq'", "allowed: dp, dp_replicate, dp_shard, pp, tp"]),
    (["--strategy", "fsdp", "--nproc", "2", "--microbatches", "4"],
     ["--microbatches: fsdp does not split batches", "pipeline strategies (pp)"]),
    (["--strategy", "pp", "--nproc", "2", "--microbatches", "5"],
     ["--microbatches", "does not divide the batch of 32"]),
    (["--strategy", "pp", "--nproc", "2", "--strategy-option", "schedule=zigzag"],
     ["schedule='zigzag'", "allowed: gpipe, 1f1b"]),
    (["--strategy", "accelerate", "--nproc", "2", "--strategy-option", "mode=fsdp"],
     ["mode=fsdp needs GPUs", "--strategy fsdp"]),
    (["--strategy", "tp", "--nproc", "2"],  # a CNN has no tensor-parallel plan
     ["--strategy tp: workload mnist does not provide tp_plan", "workloads that support tp"]),
    (["--strategy", "fsdp+tp", "--nproc", "2"],
     ["--strategy fsdp+tp: workload mnist does not provide tp_plan"]),
    (["--global-batch-size", "63", "--nproc", "2"],
     ["--global-batch-size", "not divisible by the 2 data-parallel replicas"]),
    (["--strategy", "fsdp", "--nproc", "2", "--strategy-option", "param_dtype=int8"],
     ["param_dtype='int8'", "allowed: fp32, bf16, fp16"]),
    (["--strategy", "fsdp", "--nproc", "2", "--strategy-option", "shard=yes"],
     ["fsdp has no option 'shard'", "reshard_after_forward"]),
])
def test_unsupported_combination(tmp_path, synthetic_mnist, args, needles):
    run_dir = tmp_path / "run"
    proc = run_ddl("train", "--preset", "tiny", "--data-dir", str(synthetic_mnist),
                   "--run-dir", str(run_dir), *args, cwd=tmp_path)
    # the site notice goes to stdout; stderr holds only the error
    assert_one_line_error(proc, *needles)
    assert not (run_dir / "results.json").exists()
