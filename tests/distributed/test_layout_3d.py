"""3-D parallelism from `--mesh` alone: pipeline x tensor parallel x FSDP on 8 ranks.

T5 (xsum tiny), 3 AdamW steps at a global batch of 16, as the other xsum equivalence tests.
The 3-D run goes through the real CLI with no --strategy (`ddl train --mesh
pp=2,tp=2,dp_shard=2 --nproc 8`: launcher, rendezvous, pre-flight), accumulates gradients
over 2 micro-batches of 4 per replica (`--batch-size 4`; issue 22: K micro-steps equal one
step of the same global batch, here on the N-D layout) and writes a checkpoint
after step 2; that checkpoint then resumes on 1 process, on FSDP with 2 and on HSDP with 4
ranks (the session's rank pools), and step 3 lands where the uninterrupted single process
lands. The bar is conftest.assert_same_weights (AdamW: per tensor, 1e-5 relative).
Bad meshes are refused before any worker starts: one line, exit 2, nothing written.
"""

import json

import pytest
import torch
from conftest import assert_one_line_error, assert_same_weights, run_ddl
from pool_train import prepare, train_cell

pytestmark = pytest.mark.distributed

COMMON = ["--plugin", "xsum", "--preset", "tiny", "--global-batch-size", "16", "--epochs", "1",
          "--steps-per-epoch", "3", "--seed", "7"]
THREE_D = {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2}


def _pool_run(pools, run_dir, nproc, *args):
    rank0 = pools[nproc].run(train_cell, prepare([*COMMON, *args], run_dir, nproc),
                             timeout_s=300)[0]
    return rank0["results"], rank0["model"]


@pytest.fixture(scope="module")
def single(tmp_path_factory, synthetic_xsum, rank_pools):
    return _pool_run(rank_pools, tmp_path_factory.mktemp("one") / "run", 1, "--data-dir",
                     str(synthetic_xsum))


@pytest.fixture(scope="module")
def three_d(tmp_path_factory, synthetic_xsum):
    run_dir = tmp_path_factory.mktemp("3d") / "run"
    proc = run_ddl("train", *COMMON, "--mesh", "pp=2,tp=2,dp_shard=2", "--nproc", "8",
                   "--batch-size", "4",
                   "--data-dir", str(synthetic_xsum), "--run-dir", str(run_dir),
                   "--checkpoint-every", "2", cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a user reads this output: no library warnings (deprecated T5 keywords, FSDP2's view
    # caution, DTensor's two-all-gather remark), once per rank
    assert "Warning" not in proc.stderr and "redistributing" not in proc.stderr, proc.stderr
    return (run_dir, json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "model.pt", weights_only=True))


def test_3d_from_mesh_alone_matches_one_process(three_d, single):
    _, results, weights = three_d
    ref_results, ref = single
    assert results["strategy"] == "mesh"  # picked by --mesh alone
    assert results["world"]["parallel"] == THREE_D and results["world"]["dp_size"] == 2
    assert results["batch"] == {"per_replica": 8, "global": 16, "micro": 4,
                                "accumulation_steps": 2}
    assert_same_weights(weights, ref, adam=True)
    assert torch.equal(weights["shared.weight"], weights["lm_head.weight"])  # tied, still
    report = results["strategy_report"]
    assert report["stages"] == 2 and report["microbatches"] == 4  # pipeline part
    assert report["reshard_after_forward"] is True  # FSDP part
    # every rank holds a quarter of its stage's matrices (tp x dp_shard), and less than a
    # fourth of the whole model's state plus the copies the layout keeps whole per rank
    full = ref_results["memory_per_rank"][0]["model_state_bytes"]
    per_rank = [m["model_state_bytes"] for m in results["memory_per_rank"]]
    assert len(per_rank) == 8 and max(per_rank) < full / 2, (per_rank, full)
    for split in ("val", "test"):
        for metric, value in ref_results["final"][split].items():
            assert results["final"][split][metric] == pytest.approx(value, rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("nproc, layout", [
    (1, ()),
    (2, ("--strategy", "fsdp")),
    (4, ("--mesh", "dp_replicate=2,dp_shard=2")),  # HSDP
])
def test_3d_checkpoint_resumes_on_other_layouts(tmp_path, three_d, single, synthetic_xsum,
                                                rank_pools, nproc, layout):
    run_dir, _, _ = three_d
    step_2 = run_dir / "checkpoints" / "step-00000002"
    assert json.loads((step_2 / "trainer.json").read_text())["world_size"] == 8
    results, weights = _pool_run(rank_pools, tmp_path / "run", nproc, "--data-dir",
                                 str(synthetic_xsum), "--resume", str(step_2), *layout)
    assert results["checkpoints"]["resumed_from"]["saved_by_world_size"] == 8
    assert_same_weights(weights, single[1], adam=True)


# Degrees that do not multiply to the world and unknown dimensions are arithmetic, refused
# by ddl.contract.layout.resolve (tests/unit/test_layout.py, test_layout_command.py, and
# through the CLI in test_unsupported.py); these two need the model, built on the meta
# device by the pre-flight.
@pytest.mark.parametrize("mesh, nproc, extra, needles", [
    ("tp=3", 3, (), ("--mesh", "tp=3", "4 attention heads", "allowed: tp dividing 4")),
    ("pp=9", 9, ("--microbatches", "2"), ("--mesh: pp=9", "split points", "at most 4 stages")),
])
def test_bad_meshes_are_refused_before_workers_start(tmp_path, synthetic_xsum, mesh, nproc,
                                                     extra, needles):
    run_dir = tmp_path / "run"
    proc = run_ddl("train", *COMMON, "--mesh", mesh, "--nproc", str(nproc), *extra,
                   "--data-dir", str(synthetic_xsum), "--run-dir", str(run_dir), cwd=tmp_path)
    assert_one_line_error(proc, *needles)
    assert not run_dir.exists()  # refused before the run directory was made


@pytest.mark.parametrize("setup", ["cifar-pp", "imagewoof-pp"])
def test_resnet_pipeline_shards_as_it_replicates(tmp_path_factory, request, rank_pools, setup):
    """pp=2 x dp_shard=2 on a ResNet (FSDP inside each stage) ends where pp=2 x
    dp_replicate=2 ends: the same samples reach the same ghost-BatchNorm groups (8 samples
    = one microbatch) in both, which one process's groups are not (the sampler deals
    samples to the replicas in turn), so the replicated pipeline, itself checked against
    one process in the equivalence matrix, is the reference here."""
    from test_equivalence_matrix import SETUPS

    config = SETUPS[setup]
    data_dir = request.getfixturevalue(f"synthetic_{config.workload}")
    common = ["--data-dir", str(data_dir), "--microbatches", "2"]
    runs = {}
    for name, layout in {"sharded": ("--mesh", "pp=2,dp_shard=2"),
                         "replicated": ("--strategy", "pp", "--mesh", "dp=2,pp=2")}.items():
        plan = prepare([*config.args(), *common, *layout],
                       tmp_path_factory.mktemp(name) / "run", 4)
        runs[name] = rank_pools[4].run(train_cell, plan, timeout_s=300)[0]
    sharded, replicated = runs["sharded"], runs["replicated"]
    assert sharded["results"]["world"]["parallel"]["dp_shard"] == 2
    assert_same_weights(sharded["model"], replicated["model"], adam=config.adam)
    per_rank = [m["params_bytes"] for m in sharded["results"]["memory_per_rank"]]
    whole = [m["params_bytes"] for m in replicated["results"]["memory_per_rank"]]
    assert sum(per_rank) <= sum(whole) / 2 * 1.10, (per_rank, whole)  # each stage sharded
