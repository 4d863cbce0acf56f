"""ROUGE on the test split: greedy summaries scored against the reference summaries.

ROUGE-1/2/L F-measures (Lin, "ROUGE: A Package for Automatic Evaluation of Summaries", 2004)
with Google's ``rouge-score`` (Porter stemming), as the course reports them. The model to
generate with comes from the strategy (``whole_model()``, the trainer's call of
``Strategy.generation_model``): a whole copy on every
rank (single process, DDP, the model gathered from FSDP shards or pipeline stages) lets each
rank summarise its own share and the sums of F-measures are then all-reduced; None
(tensor parallel: collectives inside every forward) means every rank runs the evaluation
module on all samples with the same inputs (identical results, no reduction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import nn

    from collections.abc import Callable

    from ddl_xsum.workload import SummaryDataset, XsumWorkload

BATCH_SIZE = 16
METRICS = ("rouge1", "rouge2", "rougeL")


def rouge_report(workload: XsumWorkload, model: nn.Module, dataset: SummaryDataset,
                 world: Any, whole_model: Callable[[], nn.Module | None]) -> dict[str, float]:
    """Mean ROUGE F-measures of the first ``workload.rouge_samples`` test articles (all of
    them if unset); {} if the model cannot generate."""
    import torch.distributed as dist
    from rouge_score import rouge_scorer

    whole = whole_model()
    shard = whole is not None and world.size > 1
    model = model if whole is None else whole
    # a wrapper that keeps the module it wraps (FSDP1 under Accelerate) generates through it
    generate = getattr(model, "generate", None) or getattr(getattr(model, "module", None),
                                                           "generate", None)
    if generate is None:
        return {}
    n = len(dataset) if workload.rouge_samples is None else min(workload.rouge_samples,
                                                                 len(dataset))
    indices = list(range(world.rank, n, world.size)) if shard else list(range(n))
    scorer = rouge_scorer.RougeScorer(list(METRICS), use_stemmer=True)
    sums = torch.zeros(len(METRICS) + 1, dtype=torch.float64)  # F-measures, then the count
    model.eval()
    with torch.no_grad():
        for start in range(0, len(indices), BATCH_SIZE):
            chunk = indices[start:start + BATCH_SIZE]
            batch = torch.utils.data.default_collate([dataset[i] for i in chunk])
            inputs, _ = workload.to_device(batch, world.device)
            out = generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                           max_new_tokens=workload.target_length, do_sample=False, num_beams=1,
                           use_cache=True)
            texts = workload._tokenizer.batch_decode(out, skip_special_tokens=True)
            for i, text in zip(chunk, texts):
                scores = scorer.score(dataset.summaries[i], text)
                sums += torch.tensor([*(scores[m].fmeasure for m in METRICS), 1.0],
                                     dtype=torch.float64)
    if shard:
        sums = sums.to(world.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        sums = sums.cpu()
    count = max(sums[-1].item(), 1.0)
    return {m: sums[k].item() / count for k, m in enumerate(METRICS)}
