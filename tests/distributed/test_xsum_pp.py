"""T5 (xsum tiny) under pipeline parallel ends where one process ends.

T5 is an encoder-decoder, so xsum builds its own stages (``ddl_xsum.pipeline``); the first
and last stage each hold a copy of the tied embedding, whose gradient the strategy sums
across them. The single-process test checks that the stages compose to the model exactly;
the multi-process tests train 3 AdamW steps with GPipe (2 ranks, through the real CLI),
1F1B (4 ranks, 4 stages), interleaved 1F1B (2 ranks x 2 stages) and 2 replicas x 2 stages
(on the session's rank pools) against one process (on the pool of one; the step losses
GPipe's rank 0 prints are compared with those the reference logged to its TensorBoard
events, the values its progress lines print). Each run evaluates the first 16 val and test
articles (`--eval-samples 16`, as the equivalence matrix): the final evaluation cannot move
the weights, 16 still divide among the replicas, and ROUGE is over the first 16 test
articles either way.

The weights are compared by conftest.assert_same_weights (AdamW: each tensor to 1e-5
relative): Adam turns a rounding difference in a near-zero gradient into a visible
difference in the update. Here the rounding differs because pipeline microbatches are
smaller matrix products and because batches keep their full padded length under pp
(stages exchange fixed-shape buffers).
"""

import json
import re

import pytest
import torch

from conftest import assert_one_line_error, assert_same_weights, run_ddl
from pool_train import prepare, train_cell

pytestmark = pytest.mark.distributed

COMMON = ["train", "--plugin", "xsum", "--preset", "tiny", "--global-batch-size", "16",
          "--epochs", "1", "--steps-per-epoch", "3", "--seed", "7", "--log-every", "1",
          "--eval-samples", "16"]


@pytest.fixture(scope="module")
def xsum_data(synthetic_xsum):
    return synthetic_xsum


def _train(tmp_path, data_dir, nproc, strategy, *extra, pools=None):
    """(results.json, model.pt, the step losses rank 0 printed) of the run: through the CLI,
    or on a rank pool when given one (tests/pool_train.py; no printed losses then: None)."""
    run_dir = tmp_path / f"{strategy}-{nproc}"
    if pools is not None:
        plan = prepare([*COMMON[1:], "--strategy", strategy, "--data-dir", str(data_dir),
                        *extra], run_dir, nproc)
        rank0 = pools[nproc].run(train_cell, plan, timeout_s=300)[0]
        return rank0["results"], rank0["model"], None
    proc = run_ddl(*COMMON, "--nproc", str(nproc), "--strategy", strategy, "--data-dir",
                   str(data_dir), "--run-dir", str(run_dir), *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    step_losses = [float(x) for x in re.findall(r"step \d+/\d+ loss (\S+) \(rank 0\)",
                                                proc.stdout)]
    return (json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "model.pt", weights_only=True), step_losses)


def _logged_step_losses(run_dir):
    """Rank 0's step losses as the run logged them (``train/step_loss`` in its TensorBoard
    events, every --log-every steps: the values its progress lines print)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [e.value for e in events.Scalars("train/step_loss")]


@pytest.fixture(scope="module")
def single(tmp_path_factory, xsum_data, rank_pools):
    """One process, on the pool of one; its step losses from its TensorBoard events."""
    tmp = tmp_path_factory.mktemp("ref")
    results, weights, _ = _train(tmp, xsum_data, 1, "ddp", pools=rank_pools)
    return results, weights, _logged_step_losses(tmp / "ddp-1")


@pytest.mark.parametrize("cuts", [[2], [1], [3], [1, 2, 3]])
def test_stages_compose_to_the_model(cuts):
    """Run one after another, the stages give the model's logits and its gradients up to
    rounding (a stack's position table, used by two stages, accumulates two sums in another
    order), and their state dicts together are the model's."""
    from transformers import T5ForConditionalGeneration

    from ddl_xsum import data
    from ddl_xsum.pipeline import build_stages
    from ddl_xsum.workload import shift_right

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(data.t5_config("t5-tiny", 300))
    ids = torch.randint(3, 300, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padded source
    labels = torch.randint(3, 300, (3, 6))
    labels[2, 4:] = -100
    decoder_ids = shift_right(labels)
    expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    expected.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    stages = build_stages(model, cuts)
    carry = (ids, mask, decoder_ids)
    for stage in stages:
        carry = stage(*carry)
    # bit-equal on earlier hosts; 1.5e-6 apart on this AMD EPYC one, where the
    # stages' differently shaped products take other oneDNN kernels
    torch.testing.assert_close(carry, expected, rtol=1e-6,
                               atol=1e-6 * float(expected.detach().abs().max()))
    carry.square().mean().backward()
    for name, param in model.named_parameters():
        scale = float(grads[name].abs().max())
        torch.testing.assert_close(param.grad, grads[name], rtol=1e-6, atol=1e-6 * scale,
                                   msg=name)
    assert set().union(*(s.state_dict() for s in stages)) == set(model.state_dict())
    # the tied embedding is "shared" in exactly the first and the last stage
    assert [hasattr(s, "shared") for s in stages] == [True] + [False] * (len(cuts) - 1) + [True]


@pytest.mark.parametrize("nproc, extra, stages, dp", [
    (2, (), 2, 1),                                                     # GPipe (the CLI)
    (4, ("--strategy-option", "schedule=1f1b"), 4, 1),
    (2, ("--strategy-option", "schedule=interleaved1f1b"), 4, 1),      # 2 stages per rank
    (4, ("--mesh", "dp=2,pp=2"), 2, 2),                                # 2 replicas x 2 stages
])
def test_matches_one_process(tmp_path, xsum_data, single, rank_pools, nproc, extra, stages,
                             dp):
    """The first case runs through the CLI (launcher, printed losses); the others on the
    session's rank pools."""
    ref_results, ref, ref_losses = single
    pools = rank_pools if extra else None
    results, weights, losses = _train(tmp_path, xsum_data, nproc, "pp", *extra, pools=pools)
    assert results["world"] == {**ref_results["world"], "size": nproc, "dp_size": dp,
                                "parallel": {"pp": nproc // dp, "dp_replicate": dp,
                                             "dp_shard": 1, "tp": 1}}
    report = results["strategy_report"]
    assert report["stages"] == stages and report["microbatches"] == 2 * stages

    assert_same_weights(weights, ref, adam=True)
    assert results["parameters"] == ref_results["parameters"]  # all stages, not rank 0's
    # both copies of the tied embedding took the same steps
    assert torch.equal(weights["shared.weight"], weights["lm_head.weight"])

    # the loss lives on the last stage; rank 0 (the first stage) prints it all the same
    if losses is not None:
        assert len(losses) == len(ref_losses) == 3
        assert losses == pytest.approx(ref_losses, abs=1.5e-4)  # printed with 4 decimals
    # evaluation and ROUGE (generated from the gathered model) agree with one process
    assert set(results["final"]["test"]) == set(ref_results["final"]["test"]) >= {"rouge1"}
    for metric, value in ref_results["final"]["test"].items():
        assert results["final"]["test"][metric] == pytest.approx(value, rel=1e-3, abs=1e-4)

    # each rank holds its stages; held twice per replica (parameter, gradient, two Adam
    # moments and a step count) are only the tied embedding and, when a stack spans two
    # stages, its position table
    full = ref_results["memory_per_rank"][0]["model_state_bytes"]
    per_rank = [m["model_state_bytes"] for m in results["memory_per_rank"]]
    twice = ["shared.weight"]
    if stages == 4:
        twice += [f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
                  for stack in ("encoder", "decoder")]
    assert max(per_rank) < full
    assert sum(per_rank) == dp * (full + sum(4 * weights[name].numel() * 4 + 4
                                             for name in twice))


def test_more_stages_than_blocks_is_refused(tmp_path, xsum_data):
    proc = run_ddl(*COMMON, "--nproc", "2", "--strategy", "pp", "--data-dir", str(xsum_data),
                   "--strategy-option", "schedule=interleaved1f1b",
                   "--strategy-option", "stages_per_rank=3", "--microbatches", "8",
                   cwd=tmp_path)
    assert_one_line_error(proc, "6 pipeline stages need 5 split points", "at most 4 stages")
