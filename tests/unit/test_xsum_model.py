"""The XSum workload's model side: loss as Hugging Face computes it, exact batch trimming,
the course's schedule, ROUGE wiring, FLOPs, and parallelism hints that resolve on the
real T5 module tree the way torch's parallelize_module reads them."""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatch

import pytest
import torch
from torch import nn

from ddl.contract.world import World
from ddl_xsum import synthetic
from ddl_xsum.plugin import PRESETS
from ddl_xsum.workload import XsumWorkload, shift_right

pytestmark = pytest.mark.unit

SIZES = {"train": 48, "validation": 16, "test": 16}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(workload, datasets, model) for the tiny preset on a small synthetic set."""
    root = tmp_path_factory.mktemp("xsum-model")
    synthetic.write_synthetic(root, sizes=SIZES, seed=1)
    workload = XsumWorkload(PRESETS["tiny"])
    splits = workload.datasets(root)
    torch.manual_seed(0)
    return workload, splits, workload.build_model()


def _batch(splits, n=6):
    return torch.utils.data.default_collate([splits["train"][i] for i in range(n)])


def test_batches_are_padded_dicts_with_ignored_labels(tiny):
    workload, splits, _ = tiny
    item = splits["train"][0]
    assert item["input_ids"].shape == (128,) and item["labels"].shape == (32,)
    n_src, n_tgt = int(item["attention_mask"].sum()), int((item["labels"] != -100).sum())
    assert (item["input_ids"][n_src:] == 0).all() and item["input_ids"][n_src - 1] == 1  # </s>
    assert item["labels"][n_tgt - 1] == 1 and (item["labels"][n_tgt:] == -100).all()
    assert len(splits["train"]) == SIZES["train"] and len(splits["val"]) == SIZES["validation"]


def test_loss_is_hugging_faces_token_mean_and_trimming_is_exact(tiny):
    workload, splits, model = tiny
    model.eval()
    batch = _batch(splits)
    with torch.no_grad():
        reference = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          labels=batch["labels"])
        inputs, targets = workload.to_device(batch, torch.device("cpu"))
        logits = workload.forward(model, inputs)
    assert inputs["input_ids"].shape[1] < 128 and targets.shape[1] < 32  # trimmed
    assert torch.equal(inputs["decoder_input_ids"], model._shift_right(targets))
    n = targets.shape[1]
    torch.testing.assert_close(logits, reference.logits[:, :n], rtol=1e-5, atol=1e-5)
    tokens = dataclasses.replace(PRESETS["tiny"], options={**PRESETS["tiny"].options,
                                                           "loss_reduction": "tokens"})
    torch.testing.assert_close(XsumWorkload(tokens).loss(logits, targets), reference.loss,
                               rtol=1e-5, atol=1e-6)
    per_sample = workload.sample_metrics(logits, targets)
    assert per_sample["loss"].shape == per_sample["token_accuracy"].shape == (6,)
    torch.testing.assert_close(workload.loss(logits, targets), per_sample["loss"].mean())


def test_training_metrics_reuse_the_losses_token_losses_and_hold_no_logits(tiny, monkeypatch):
    """The trainer's sample_metrics on the logits a training loss was just computed from
    reuses that loss's per-token cross-entropy (one [batch, length, vocabulary] pass, not
    two) with the same values; other logits are computed afresh; the logits are not kept
    alive by the workload."""
    import gc
    import weakref

    from ddl_xsum import workload as module

    workload, splits, model = tiny
    model.train()
    inputs, targets = workload.to_device(_batch(splits), torch.device("cpu"))
    logits = workload.forward(model, inputs)
    with torch.no_grad():
        fresh = workload.sample_metrics(logits.detach().clone(), targets)  # not remembered
    calls = []
    original = module.token_losses
    monkeypatch.setattr(module, "token_losses", lambda *a: calls.append(1) or original(*a))
    workload.loss(logits, targets).backward()
    with torch.no_grad():
        reused = workload.sample_metrics(logits, targets)
    assert len(calls) == 1  # the loss's pass only
    for name in fresh:
        assert torch.equal(reused[name], fresh[name]), name
    with torch.no_grad():  # asked again (or for other logits): computed afresh
        workload.sample_metrics(logits, targets)
    assert len(calls) == 2
    kept = weakref.ref(logits)
    workload.loss(workload.forward(model, inputs), targets)  # remembered, then dropped
    del logits
    gc.collect()
    assert kept() is None


def test_shift_right_starts_with_pad_and_hides_ignored_positions():
    labels = torch.tensor([[5, 6, 1, -100], [7, 1, -100, -100]])
    assert shift_right(labels).tolist() == [[0, 5, 6, 1], [0, 7, 1, 0]]


def test_course_schedule_and_optimizer():
    course = XsumWorkload(PRESETS["course"])
    assert PRESETS["course"].epochs == 10 and PRESETS["course"].batch_size == 4
    assert PRESETS["course"].lr == 2e-3
    assert [course.lr_factor(e) for e in range(3)] == pytest.approx([1.0, 0.3, 0.09])
    opt = course.optimizer([nn.Parameter(torch.zeros(2))], 2e-3)
    assert isinstance(opt, torch.optim.AdamW)
    assert (course.source_length, course.target_length) == (512, 150)


def test_flops_per_sample_matches_torchs_flop_counter(tiny):
    from torch.utils.flop_counter import FlopCounterMode

    workload, _, model = tiny
    S, T = workload.source_length, workload.target_length
    inputs = {"input_ids": torch.randint(3, 100, (2, S)),
              "attention_mask": torch.ones(2, S, dtype=torch.long),
              "decoder_input_ids": torch.randint(3, 100, (2, T))}
    with FlopCounterMode(display=False) as counter:
        workload.loss(workload.forward(model, inputs), torch.randint(3, 100, (2, T))).backward()
    model.zero_grad()
    measured = counter.get_total_flops() / 2
    assert workload.flops_per_sample() == pytest.approx(measured, rel=0.08)


def test_parallelism_hints_resolve_on_the_t5_module_tree(tiny):
    _, _, model = tiny
    workload = XsumWorkload(PRESETS["tiny"])
    units = workload.fsdp_units(model)
    assert len(units) == 4 and {type(u).__name__ for u in units} == {"T5Block"}
    for path in workload.pipeline_splits(model):
        model.get_submodule(path)

    plan = workload.tp_plan(model)
    assert set(plan.values()) == {"colwise", "rowwise"}
    names = dict(model.named_modules())
    covered: dict[str, str] = {}
    for key, style in plan.items():
        # parallelize_module splits a key at "." and fnmatches each part to child names
        parts = key.split(".")
        matched = [n for n in names if n and len(n.split(".")) == len(parts)
                   and all(fnmatch(a, b) for a, b in zip(n.split("."), parts))]
        assert matched, f"plan key {key!r} matches no module"
        for name in matched:
            assert name not in covered, f"{name} is in the plan twice"
            covered[name] = style
    linears = {n for n, m in names.items() if isinstance(m, nn.Linear) and n != "lm_head"}
    assert linears == {n for n in covered if isinstance(names[n], nn.Linear)}
    for name, style in covered.items():
        last = name.rsplit(".", 1)[-1]
        assert style == ("rowwise" if last in ("o", "wo") else "colwise"), name
    biases = {n for n in names if n.endswith("relative_attention_bias")}
    assert biases == {n for n in covered if isinstance(names[n], nn.Embedding)}


class _Echo(nn.Module):
    """Stands in for a model that summarises perfectly: generate() returns the references."""

    def __init__(self, workload, dataset):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.workload, self.dataset, self.calls = workload, dataset, 0

    def generate(self, input_ids, **kwargs):
        assert kwargs["max_new_tokens"] == self.workload.target_length
        assert kwargs["num_beams"] == 1 and kwargs["do_sample"] is False
        texts = self.dataset.summaries[self.calls:self.calls + len(input_ids)]
        self.calls += len(input_ids)
        tok = self.workload._tokenizer
        return tok(texts, padding=True, return_tensors="pt")["input_ids"]


def test_rouge_report_scores_the_references_as_perfect(tiny):
    workload, splits, model = tiny
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    echo = _Echo(workload, splits["test"])
    report = workload.test_report(echo, splits["test"], world, lambda: echo)  # one process
    assert report == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    untrained = workload.test_report(model, splits["test"], world, lambda: model)  # generate()
    assert set(untrained) == {"rouge1", "rouge2", "rougeL"}
    # exempt: a bound on the untrained model's ROUGE, not a learning threshold
    assert 0.0 <= untrained["rouge1"] < 0.5
    off = dataclasses.replace(PRESETS["tiny"], options={**PRESETS["tiny"].options, "rouge": False})
    assert XsumWorkload(off).test_report(model, splits["test"], world, lambda: model) == {}
