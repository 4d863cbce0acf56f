"""T5 (xsum tiny) under FSDP, HSDP, Accelerate, tensor parallel and 2-D FSDP x TP ends where
one process ends.

Same seed and global batch, 3 AdamW steps; the weights are compared by
conftest.assert_same_weights (AdamW: each tensor to 1e-5 relative, see there why not each
element). All run the worker's own trainer on the session's rank pools
(tests/pool_train.py), which saves a process start per rank and run; tp and fsdp+tp go
through the real CLI in docs/tutorial.md's steps 5 and 7 (test_docs_commands.py).

Each run evaluates the first 16 val and test articles (`--eval-samples 16`, as the
equivalence matrix does): the final evaluation comes after the last step, so it cannot move
the weights, and 16 still divide among 1, 2 and 4 replicas whose metrics must add up to one
process's; ROUGE is over the first 16 test articles either way (the preset's
rouge_samples). Whole splits are evaluated by test_xsum_train.py's learning run.
"""


import pytest
from conftest import assert_same_weights
from pool_train import prepare, train_cell

pytestmark = pytest.mark.distributed

COMMON = ["train", "--plugin", "xsum", "--preset", "tiny", "--global-batch-size", "16",
          "--epochs", "1", "--steps-per-epoch", "3", "--seed", "7", "--eval-samples", "16"]
# FSDP on 2 ranks generating from a gathered whole copy: a case of test_matches_one_process
# and the reference of test_generation_on_the_shards_equals_the_gathered_copy (one run).
FSDP_GATHER = ("--strategy-option", "generation=gather")


@pytest.fixture(scope="module")
def xsum_data(synthetic_xsum):
    return synthetic_xsum


def _train(tmp_path, data_dir, nproc, strategy, *extra, pools):
    """(results.json, model.pt) of the run on the rank pool of ``nproc``."""
    run_dir = tmp_path / f"{strategy}-{nproc}"
    args = [*COMMON[1:], "--strategy", strategy, "--data-dir", str(data_dir), *extra]
    rank0 = pools[nproc].run(train_cell, prepare(args, run_dir, nproc), timeout_s=300)[0]
    return rank0["results"], rank0["model"]


@pytest.fixture(scope="module")
def single(tmp_path_factory, xsum_data, rank_pools):
    return _train(tmp_path_factory.mktemp("ref"), xsum_data, 1, "ddp", pools=rank_pools)


@pytest.fixture(scope="module")
def fsdp_gathered(tmp_path_factory, xsum_data, rank_pools):
    return _train(tmp_path_factory.mktemp("fsdp-gather"), xsum_data, 2, "fsdp", *FSDP_GATHER,
                  pools=rank_pools)


@pytest.mark.parametrize("nproc, strategy, extra, dp", [
    (2, "fsdp", FSDP_GATHER, 2),
    (2, "accelerate", (), 2),
    (2, "tp", (), 1),
    (4, "fsdp+tp", ("--mesh", "dp=2,tp=2"), 2),
])
def test_matches_one_process(request, tmp_path, xsum_data, single, rank_pools, nproc, strategy,
                             extra, dp):
    ref_results, ref = single
    if (nproc, strategy, extra) == (2, "fsdp", FSDP_GATHER):
        results, weights = request.getfixturevalue("fsdp_gathered")
    else:
        results, weights = _train(tmp_path, xsum_data, nproc, strategy, *extra,
                                  pools=rank_pools)
    assert results["world"]["size"] == nproc and results["world"]["dp_size"] == dp
    assert_same_weights(weights, ref, adam=True)
    assert results["parameters"] == ref_results["parameters"]
    for metric, value in ref_results["final"]["test"].items():
        assert results["final"]["test"][metric] == pytest.approx(value, rel=1e-3, abs=1e-4)


def test_hsdp_matches_one_process_and_shards_within_groups(tmp_path, xsum_data, single,
                                                          rank_pools):
    """HSDP (2 replicas of 2 shards) ends where one process ends, and keeps each parameter
    in dp_shard pieces, not world-size pieces: per rank half of the model's parameter bytes
    (a quarter under plain FSDP on 4 ranks)."""
    ref_results, ref = single
    results, weights = _train(tmp_path, xsum_data, 4, "fsdp", "--mesh",
                              "dp_replicate=2,dp_shard=2", pools=rank_pools)
    assert results["world"]["parallel"] == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "tp": 1}
    assert results["world"]["dp_size"] == 4
    assert_same_weights(weights, ref, adam=True)
    full = ref_results["memory_per_rank"][0]["params_bytes"]
    for rank in results["memory_per_rank"]:
        assert rank["params_bytes"] == pytest.approx(full / 2, rel=0.1)


def test_generation_on_the_shards_equals_the_gathered_copy(tmp_path, xsum_data, rank_pools,
                                                          fsdp_gathered):
    """ROUGE under FSDP from generate() on the shards (--strategy-option generation=sharded:
    what `auto` picks when a whole copy per rank would not fit, e.g. t5-large on 4 CPU
    ranks) equals ROUGE from the gathered whole copy (the run test_matches_one_process's
    fsdp case checks against one process: the same flags but the option)."""
    runs = {"gather": fsdp_gathered[0]["final"]["test"],
            "sharded": _train(tmp_path / "sharded", xsum_data, 2, "fsdp", "--strategy-option",
                              "generation=sharded", pools=rank_pools)[0]["final"]["test"]}
    assert "rouge1" in runs["sharded"]
    for metric, value in runs["gather"].items():
        assert runs["sharded"][metric] == pytest.approx(value, rel=1e-6, abs=1e-9), metric
