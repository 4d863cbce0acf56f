"""--clip-grad-norm clips by the whole model's gradient norm under every strategy: the norm
each run records (before clipping) and the weights after 3 steps equal one process's.

T5 tiny (xsum) on 2 processes under fsdp (DTensor shards), tp (DTensor shards and
replicated plain tensors) and pp (stages on different ranks, the tied embedding on two of
them). The norm is compared directly: AdamW is nearly invariant to a gradient's scale, so a
wrong norm would hardly show in the weights alone. The limit (0.5) is below the norm
(~1.6 at the start), so every step is clipped.
"""

import json

import pytest
import torch

from conftest import assert_same_weights, run_ddl

pytestmark = pytest.mark.distributed

CLIP = ["train", "--plugin", "xsum", "--preset", "tiny", "--global-batch-size", "16",
        "--epochs", "1", "--steps-per-epoch", "3", "--seed", "7", "--clip-grad-norm", "0.5"]


def _train(tmp_path, data_dir, nproc, strategy):
    run_dir = tmp_path / f"{strategy}-{nproc}"
    proc = run_ddl(*CLIP, "--nproc", str(nproc), "--strategy", strategy, "--data-dir",
                   str(data_dir), "--run-dir", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "model.pt", weights_only=True))


@pytest.fixture(scope="module")
def single(tmp_path_factory, synthetic_xsum):
    return _train(tmp_path_factory.mktemp("ref"), synthetic_xsum, 1, "ddp")


@pytest.mark.parametrize("strategy", ["fsdp", "tp", "pp"])
def test_clipped_by_the_global_norm(tmp_path, synthetic_xsum, single, strategy):
    ref_results, ref = single
    want = ref_results["epochs"][0]["grad_norm"]
    assert want > 0.5  # the limit binds
    results, weights = _train(tmp_path, synthetic_xsum, 2, strategy)
    assert results["epochs"][0]["grad_norm"] == pytest.approx(want, rel=1e-4)
    assert_same_weights(weights, ref, adam=True)
