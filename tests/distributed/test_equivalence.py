"""Same seed, same global batch: every strategy ends with the parameters of one process.

All runs go through the real CLI: N processes under torch's elastic launcher talking over
gloo, against a world of one. Gradients averaged over N replicas of 64/N samples must equal
the gradient of one 64-sample batch, so after every step the weights agree up to float
rounding (~1e-7 here; the design's bar is 1e-5 relative).
"""

import json

import pytest
import torch

from conftest import run_ddl

pytestmark = pytest.mark.distributed

COMMON = ["train", "--preset", "tiny", "--global-batch-size", "64", "--epochs", "2",
          "--steps-per-epoch", "3", "--seed", "7"]


def _train(tmp_path, data_dir, nproc, strategy="ddp", *extra):
    run_dir = tmp_path / f"{strategy}-np{nproc}"
    proc = run_ddl(*COMMON, "--nproc", str(nproc), "--data-dir", str(data_dir),
                   "--run-dir", str(run_dir), "--strategy", strategy, *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((run_dir / "results.json").read_text())
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    return results, weights


def _initial_weights():
    from ddl_mnist.plugin import PRESETS
    from ddl_mnist.workload import MnistWorkload

    torch.manual_seed(7)
    return MnistWorkload(PRESETS["tiny"]).build_model().state_dict()


@pytest.fixture(scope="module")
def single_process(tmp_path_factory, synthetic_mnist):
    return _train(tmp_path_factory.mktemp("reference"), synthetic_mnist, 1)


@pytest.mark.parametrize("strategy, nproc, extra", [
    ("ddp", 2, ()), ("fsdp", 2, ()), ("fsdp", 4, ()), ("accelerate", 2, ()),
    ("pp", 2, ()),  # GPipe, 2 stages, 4 microbatches
    ("pp", 3, ("--strategy-option", "schedule=1f1b", "--microbatches", "8")),
])
def test_n_ranks_match_one_process(tmp_path, synthetic_mnist, single_process, strategy, nproc,
                                   extra):
    one, w1 = single_process
    two, w2 = _train(tmp_path, synthetic_mnist, nproc, strategy, *extra)
    assert one["world"]["size"] == 1 and two["world"]["size"] == nproc
    assert two["strategy"] == strategy
    replicas = 1 if strategy == "pp" else nproc  # pipeline stages all see the whole batch
    assert two["batch"] == {"per_replica": 64 // replicas, "global": 64}
    assert one["steps_per_epoch"] == two["steps_per_epoch"] == 3  # 6 optimizer steps in all

    initial = _initial_weights()
    assert w1.keys() == w2.keys() == initial.keys()
    for name in w1:
        assert not torch.equal(w1[name], initial[name]), f"{name} never changed"
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
    # FSDP keeps 1/N of the parameters, gradients and optimizer state on each rank
    full = one["memory_per_rank"][0]["model_state_bytes"]
    per_rank = [m["model_state_bytes"] for m in two["memory_per_rank"]]
    assert len(per_rank) == nproc
    if strategy == "fsdp":
        assert max(per_rank) <= full / nproc * 1.10, (per_rank, full)
    elif strategy == "pp":  # each stage holds its own layers only; together, the model
        assert sum(per_rank) == full and max(per_rank) < full
    else:
        assert per_rank == [full] * nproc
    # metrics are exact over all samples, so they agree too
    for split in ("val", "test"):
        for metric, value in one["final"][split].items():
            assert two["final"][split][metric] == pytest.approx(value, rel=1e-4)
