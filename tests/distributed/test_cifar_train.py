"""The cifar workload end to end, on 2 CPU processes.

1. `ddl prepare --plugin cifar --synthetic` then `ddl train --plugin cifar --preset tiny
   --nproc 2 --epochs 4` through the real CLI: finishes, and learns (10 shape classes:
   chance is 10 %; the untrained model's accuracy and loss on the same splits are the
   reference).
2. Same seed, same global batch: with BatchNorm synchronised over the ranks (`--preset tiny
   --sync-bn`), 2 ranks of ddp, fsdp and accelerate end with the weights of 1 process
   (accelerate through the real CLI; the one process, ddp and fsdp on the session's rank
   pools, tests/pool_train.py: ddp's CLI path is run 1's, fsdp's
   test_equivalence_matrix.py::test_cli_run_equals_pool_run's). Plain
   BatchNorm (without --sync-bn, as in the course) normalises each rank's half-batch on its
   own and does not match; that is BN's semantics, not a DDP error (measured here: 0.13 max
   abs weight difference after 6 steps), and it shows the switch is what makes them agree.
   The lr is the course's 0.01: at the tiny preset's 0.1 the first steps are chaotic enough
   (ReLU and max-pool switches) that float rounding alone grows to 1e-3 within 3 steps.
3. Pipeline parallel on 2 ranks (GPipe, interleaved 1F1B) ends with the weights of 1 process
   (on the rank pools; pp's CLI path: test_xsum_pp.py's GPipe case).
"""

import json

import pytest
import torch

from conftest import run_ddl
from pool_train import run_on_pool

from ddl_cifar import data, model
from ddl_cifar.plugin import PRESETS
from ddl_cifar.workload import CifarWorkload
from untrained import learning_seed, untrained_metrics

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def prepared_cifar(tmp_path_factory):
    """The default synthetic set (5000 train / 1000 test), made by the real CLI."""
    root = tmp_path_factory.mktemp("cifar-prepared")
    proc = run_ddl("prepare", "--plugin", "cifar", "--synthetic", "--data-dir", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data.is_synthetic(root)
    return root


def test_tiny_trains_and_learns_on_two_processes(tmp_path, prepared_cifar):
    run_dir = tmp_path / "run"
    # the run's TMPDIR: nothing may be left in it, and a long one (a cluster job's scratch
    # folder) must not break the fork server's socket (a socket path has 107 bytes at most)
    scratch = tmp_path / ("scratch-" * 10)
    scratch.mkdir()
    seed = learning_seed()  # DDL_TEST_SEED=1..5: the sweep recorded in docs/testing.md
    # 4 of the preset's 8 epochs (CI time)
    proc = run_ddl("train", "--plugin", "cifar", "--preset", "tiny", "--nproc", "2",
                   "--epochs", "4", "--seed", str(seed), "--data-dir", str(prepared_cifar),
                   "--run-dir", str(run_dir), cwd=tmp_path, env={"TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # torch's agent folder was left in /tmp after every run; inductor's cache is meant to stay
    left = [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")]
    assert not left, f"left behind in TMPDIR: {left}"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world"]["size"] == 2 and results["data"]["synthetic"] is True
    assert results["preset"] == "tiny" and len(results["epochs"]) == 4
    arch = model.Arch.from_options(PRESETS["tiny"].options)
    assert results["parameters"] == model.count_parameters(arch)["trainable"]
    # It learned: measured from the model ddl builds at this seed before any step, on the
    # same held-out splits (tests/untrained.py), with margins that hold across seeds and
    # CPUs (docs/testing.md, "How learning thresholds are chosen"; issue 44: another CPU
    # reached 0.338 val accuracy, a gain of ~0.25, and failed the ">= 0.35" that was here).
    workload = CifarWorkload(PRESETS["tiny"])
    for split in ("val", "test"):
        untrained = untrained_metrics(workload, prepared_cifar, split, seed)
        final = results["final"][split]
        accuracy_gain = final["accuracy"] - untrained["accuracy"]
        # seeds 1-5: 0.358-0.544; untrained 0
        assert accuracy_gain >= 0.10, (split, final, untrained)
        loss_ratio = final["loss"] / untrained["loss"]
        # seeds 1-5: 0.438-0.662; untrained 1
        assert loss_ratio < 0.9, (split, final, untrained)


def test_loader_workers_run_under_a_long_tmpdir(tmp_path, prepared_cifar):
    """A loader worker hands each batch over through a Unix socket under TMPDIR: with a
    long TMPDIR (a cluster job's scratch folder) it died with "AF_UNIX path too long" and
    the rank waited for it (ddl.worker.process.socket_folder). The evaluations take the
    first 16 samples (`--eval-samples 16`): their batches come through the worker too."""
    scratch = tmp_path / ("scratch-" * 10)
    scratch.mkdir()
    proc = run_ddl("train", "--plugin", "cifar", "--preset", "tiny", "--nproc", "1",
                   "--workers", "1", "--epochs", "1", "--steps-per-epoch", "2", *EVAL_16,
                   "--data-dir", str(prepared_cifar), "--run-dir", str(tmp_path / "run"),
                   cwd=tmp_path, env={"TMPDIR": str(scratch)}, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["loader_workers"] == 1, results.get("loader_workers")


def _train(tmp_path, data_dir, nproc, strategy="ddp", sync_bn="--sync-bn", *more, pools=None):
    """(results.json, model.pt) of the run: through the real CLI, or on the session's rank
    pool of ``nproc`` when given the pools (tests/pool_train.py: the same run plan and
    trainer, bit-identical weights)."""
    run_dir = tmp_path / f"np{nproc}-{strategy}{sync_bn}"
    args = ["--plugin", "cifar", "--preset", "tiny", sync_bn, "--lr", "0.01",
            "--global-batch-size", "64", "--epochs", "2", "--steps-per-epoch", "3",
            "--seed", "7", "--data-dir", str(data_dir), "--strategy", strategy, *more]
    if pools is not None:
        return run_on_pool(pools, run_dir, nproc, args)
    proc = run_ddl("train", *args, "--nproc", str(nproc), "--run-dir", str(run_dir),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((run_dir / "results.json").read_text())
    return results, torch.load(run_dir / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def syncbn_reference(tmp_path_factory, prepared_cifar, rank_pools):
    """One process (on the pool of one), made once for the three strategies compared with
    it."""
    return _train(tmp_path_factory.mktemp("syncbn-ref"), prepared_cifar, 1, pools=rank_pools)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "accelerate"])
def test_synchronised_batchnorm_makes_two_ranks_match_one(tmp_path, prepared_cifar,
                                                          syncbn_reference, rank_pools,
                                                          strategy):
    """ddp and fsdp on the rank pool of two, accelerate through the real CLI (its only
    run through the launcher). The whole val and test splits are evaluated: the ranks'
    metrics, last partial batches included, must add up to one process's."""
    one, w1 = syncbn_reference
    pools = None if strategy == "accelerate" else rank_pools
    two, w2 = _train(tmp_path, prepared_cifar, 2, strategy, pools=pools)
    assert two["batch"] == {"per_replica": 32, "global": 64, "micro": 32, "accumulation_steps": 1}
    torch.manual_seed(7)
    initial = model.build(PRESETS["tiny"].options).state_dict()
    assert w1.keys() == w2.keys() == initial.keys()
    for name in w1:
        if ("conv" in name and name.endswith("weight")) or name.endswith("running_mean"):
            assert not torch.equal(w1[name], initial[name]), f"{name} never changed"
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")
    for split in ("val", "test"):
        for metric, value in one["final"][split].items():
            assert two["final"][split][metric] == pytest.approx(value, rel=1e-4)


def test_without_sync_bn_two_ranks_differ(tmp_path, prepared_cifar, syncbn_reference,
                                          rank_pools):
    """The same 2-rank ddp run with plain BatchNorm (--no-sync-bn) does not end where one
    process ends: --sync-bn is what makes the test above pass. (Weights only: the final
    evaluation, after the last step, cannot move them, so 16 samples of it.)"""
    _, w1 = syncbn_reference
    _, w2 = _train(tmp_path, prepared_cifar, 2, "ddp", "--no-sync-bn", *EVAL_16,
                   pools=rank_pools)
    worst = max(float((w2[n].float() - w1[n].float()).abs().max()) for n in w1)
    assert worst > 1e-2, worst


# The first 16 val and test samples only, for runs whose weights alone are compared: the
# final evaluation comes after the last step and cannot move them
# (test_equivalence_matrix.py's EVAL).
EVAL_16 = ("--eval-samples", "16")


def _train_tiny(tmp_path, data_dir, nproc, pools, *more):
    """On the session's rank pool of ``nproc`` (tests/pool_train.py)."""
    run_dir = tmp_path / f"pp{nproc}{len(more)}"
    return run_on_pool(pools, run_dir, nproc, [
        "--plugin", "cifar", "--preset", "tiny", "--lr", "0.01", "--global-batch-size", "32",
        "--epochs", "1", "--steps-per-epoch", "3", "--seed", "7", *EVAL_16,
        "--data-dir", str(data_dir), *more])


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory, prepared_cifar, rank_pools):
    return _train_tiny(tmp_path_factory.mktemp("tiny-ref"), prepared_cifar, 1, rank_pools)


@pytest.mark.parametrize("nproc, extra", [
    (2, ("--microbatches", "1")),  # GPipe, 2 stages
    (2, ("--microbatches", "1", "--strategy-option", "schedule=interleaved1f1b")),  # 4 stages
])
def test_pipeline_matches_one_process(tmp_path, prepared_cifar, tiny_reference, rank_pools,
                                      nproc, extra):
    """Pipeline parallel on the ResNet. One microbatch: BatchNorm statistics are taken over
    a microbatch, so with several microbatches a BN model legitimately differs from one
    process; with one, every stage sees the whole batch and the weights must agree. On the
    rank pools; pp through the launcher is test_xsum_pp.py's GPipe case."""
    ref_results, ref = tiny_reference
    results, weights = _train_tiny(tmp_path, prepared_cifar, nproc, rank_pools,
                                   "--strategy", "pp", *extra)
    assert results["strategy_report"]["stages"] in (2, 4)
    for name, expected in ref.items():
        torch.testing.assert_close(weights[name], expected, rtol=1e-5, atol=1e-6)
