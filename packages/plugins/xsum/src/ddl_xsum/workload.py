"""XSum summarisation with T5, the LLM workload of JSC's course "Bringing Deep Learning
Workloads to JSC supercomputers".

Course setup: ``T5ForConditionalGeneration.from_pretrained("t5-base", use_cache=False)``
and its tokenizer; XSum slices train 1500 / validation 300 / test 300; inputs truncated to
512 tokens, summaries to 150; batch 4, 10 epochs, AdamW lr 0.002, StepLR(step_size=1,
gamma=0.3), seed 1. T5 is the encoder-decoder of Raffel et al., "Exploring the Limits of
Transfer Learning with a Unified Text-to-Text Transformer", JMLR 2020.

Batches are dicts: ``input_ids``, ``attention_mask`` and ``labels`` (summary tokens, pad
replaced by -100, which the loss ignores). Samples are tokenised once when the datasets are
built (in memory: nothing is written next to the shared data, so ranks never race on cache
files) and padded to the preset's fixed lengths, so torch's default collation stacks them;
:meth:`XsumWorkload.to_device` then trims each batch to its longest sequence. Trimming
is exact (T5's relative position bias does not depend on absolute positions, padded keys
are masked, padded queries and labels never reach the loss) and saves most of the compute
of short batches.

All model and tokenizer files are read from the data directory with the Hugging Face
offline variables set and ``local_files_only``: training never contacts the Hub.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ddl.contract.fast_optim import fused_on_gpu
from ddl.contract.workload import Workload
from ddl_xsum import data, model_files
from ddl_xsum.attention_mask import prepared_mask
from ddl_xsum.model_files import T5_VOCABULARY
from ddl_xsum.token_losses import RecentTokenLosses, token_losses

SPLIT_NAMES = {"train": "train", "val": "validation", "test": "test"}


def _go_offline() -> None:
    """Training reads only local files: make the HF libraries refuse the network before
    they are imported (they read these variables at import time)."""
    for var in data.OFFLINE_VARS:
        os.environ[var] = "1"
    data.quiet_hf()


class SummaryDataset(Dataset):
    """Tokenised (document, summary) pairs, padded to fixed lengths.

    Keeps the raw summaries too: ROUGE compares generated text with the reference text,
    not with its truncated tokenisation.
    """

    def __init__(self, sources: list[list[int]], targets: list[list[int]], summaries: list[str],
                 source_length: int, target_length: int, pad_id: int) -> None:
        self.sources, self.targets, self.summaries = sources, targets, summaries
        self.source_length, self.target_length, self.pad_id = source_length, target_length, pad_id

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        src, tgt = self.sources[i], self.targets[i]
        input_ids = torch.full((self.source_length,), self.pad_id, dtype=torch.long)
        input_ids[: len(src)] = torch.tensor(src, dtype=torch.long)
        attention_mask = torch.zeros(self.source_length, dtype=torch.long)
        attention_mask[: len(src)] = 1
        labels = torch.full((self.target_length,), -100, dtype=torch.long)
        labels[: len(tgt)] = torch.tensor(tgt, dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def shift_right(labels: torch.Tensor, start_id: int = 0, pad_id: int = 0) -> torch.Tensor:
    """Decoder inputs for teacher forcing: the start token (T5: <pad>), then the labels up
    to the last one, with the ignored positions (-100) as <pad>. What T5's own
    ``_shift_right`` does, done here so forward() needs no access to a wrapped model."""
    shifted = labels.new_full(labels.shape, pad_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = start_id
    return shifted.masked_fill(shifted == -100, pad_id)


class XsumWorkload(Workload):
    """Options (from the preset): ``model`` (t5-base, t5-small, t5-tiny), ``tokenizer``
    (whose vocabulary; synthetic data always uses its own), ``max_source_length``,
    ``max_target_length``, ``source_prefix`` (T5's task prefix), ``loss_reduction``
    ("tokens": mean over all label tokens of the batch, as HF computes it; "samples": mean
    of per-sample token means), ``lr_gamma`` (StepLR), ``train_samples``/``eval_samples``
    (prefixes of the splits), ``rouge`` and ``rouge_samples``."""

    def __init__(self, preset) -> None:
        super().__init__(preset)
        o = dict(preset.options)
        self.model_name: str = o.get("model", "t5-base")
        self.tokenizer_name: str = o.get("tokenizer", self.model_name)
        self.source_length: int = o.get("max_source_length", 512)
        self.target_length: int = o.get("max_target_length", 150)
        self.prefix: str = o.get("source_prefix", "summarize: ")
        self.loss_reduction: str = o.get("loss_reduction", "tokens")
        self.gamma: float = o.get("lr_gamma", 0.3)
        self.rouge: bool = o.get("rouge", True)
        self.rouge_samples: int | None = o.get("rouge_samples")
        self.train_samples: int | None = o.get("train_samples")
        self.eval_samples: int | None = o.get("eval_samples")
        self._data_dir: Path | None = None
        self._tokenizer = None
        self._vocab_size: int | None = None
        self.trim_batches = True  # off under pipeline parallel (see pipeline_stages)
        self._recent = RecentTokenLosses()  # the loss's, for sample_metrics (no second pass)

    # --- data -------------------------------------------------------------------------
    data_module = "ddl_xsum.data"
    synthetic_module = "ddl_xsum.synthetic"

    def check_data(self, data_dir: Path) -> None:
        """Overrides the default: what is checked depends on the preset's model and
        tokenizer."""
        data.check(data_dir, model=self.model_name, tokenizer=self.tokenizer_name)

    def tokenizer(self, data_dir: Path):
        if self._tokenizer is None:
            _go_offline()
            from transformers import AutoTokenizer

            synthetic = data.is_synthetic(data_dir)
            self._tokenizer = AutoTokenizer.from_pretrained(
                str(data.tokenizer_dir(data_dir, self.tokenizer_name, synthetic)),
                local_files_only=True)
            self._data_dir = Path(data_dir)
        return self._tokenizer

    def datasets(self, data_dir: Path) -> dict[str, Dataset]:
        _go_offline()
        import datasets as hf_datasets
        # imported now, not in build_model: results.json's build peak is the model's,
        # not the library's (~60 MB of code and objects)
        import transformers.models.t5.modeling_t5  # noqa: F401

        tok = self.tokenizer(data_dir)
        ddict = hf_datasets.load_from_disk(str(data.dataset_dir(data_dir)), keep_in_memory=True)
        out = {}
        for name, split in SPLIT_NAMES.items():
            ds = ddict[split]
            limit = self.train_samples if name == "train" else self.eval_samples
            if limit is not None:
                ds = ds.select(range(min(limit, len(ds))))
            documents = [self.prefix + d for d in ds["document"]]
            summaries = list(ds["summary"])
            sources = tok(documents, truncation=True, max_length=self.source_length)["input_ids"]
            targets = tok(summaries, truncation=True, max_length=self.target_length)["input_ids"]
            out[name] = SummaryDataset(sources, targets, summaries, self.source_length,
                                       self.target_length, tok.pad_token_id)
        return out

    # --- model, loss, metrics -----------------------------------------------------------
    def build_model(self) -> nn.Module:
        if self._data_dir is None and self.context is not None:
            self._data_dir = Path(self.context.data_dir)  # the pre-flight's meta build
        if self._data_dir is None:
            raise RuntimeError("XsumWorkload.build_model() needs datasets() first (it reads "
                               "the tokenizer and model files from the data directory)")
        _go_offline()
        return self._remember_vocab(model_files.build(self, self._data_dir))

    def pretrained_weights(self) -> Path | None:
        """The model directory's safetensors (t5-base/-small as ``ddl prepare`` saved them,
        or weights a user or test put beside a synthetic config), else None."""
        return model_files.pretrained_weights(self.model_name, self._data_dir)

    def _remember_vocab(self, model: nn.Module) -> nn.Module:
        self._vocab_size = model.config.vocab_size
        return model

    def prepare(self, data_dir: Path, *, synthetic: bool) -> Path:
        """The contract's prepare; a real download also fetches this preset's model when
        it is one of the bigger ones (``ddl prepare --plugin xsum --preset t5-large``)."""
        if synthetic:
            return super().prepare(data_dir, synthetic=True)
        extra = (self.model_name,) if self.model_name in data.LARGE_HUB_MODELS else ()
        return data.download(data_dir, extra)

    def to_device(self, batch: dict[str, torch.Tensor], device: torch.device):
        # Trim the fixed-length padding to the longest sequence of this batch (exact, see
        # the module docstring; not under pipeline parallel); padding is on the right.
        n_src, n_tgt = batch["input_ids"].shape[1], batch["labels"].shape[1]
        if self.trim_batches:
            n_src = int(batch["attention_mask"].sum(1).max())
            n_tgt = max(1, int((batch["labels"] != -100).sum(1).max()))
        labels = batch["labels"][:, :n_tgt]
        inputs = {
            "input_ids": batch["input_ids"][:, :n_src],
            "attention_mask": batch["attention_mask"][:, :n_src],
            "decoder_input_ids": shift_right(labels),
        }
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
        return inputs, labels.to(device, non_blocking=True)

    def forward(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**{**inputs, "attention_mask": prepared_mask(inputs["attention_mask"])}
                     ).logits

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ce, mask = token_losses(outputs, targets)
        self._recent.remember(outputs, targets, ce, mask)
        if self.loss_reduction == "samples":
            return (ce.sum(1) / mask.sum(1).clamp(min=1)).mean()
        # HF's T5 loss: CrossEntropyLoss(ignore_index=-100) over every label token
        return ce.sum() / mask.sum().clamp(min=1)

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        ce, mask = self._recent.take(outputs, targets) or token_losses(outputs, targets)
        n = mask.sum(1).clamp(min=1)
        correct = ((outputs.argmax(-1) == targets) & mask).sum(1)
        return {"loss": ce.sum(1) / n, "token_accuracy": correct / n}

    # --- optimisation -------------------------------------------------------------------
    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.AdamW(params, lr=lr, **fused_on_gpu(params))

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """Perplexity: exp of the split's mean loss (each article's mean token loss,
        averaged over all articles of all ranks), not a mean of per-article perplexities."""
        import math

        return {"perplexity": math.exp(min(means["loss"], 50.0))} if "loss" in means else {}

    def lr_factor(self, epoch: int) -> float:
        """StepLR(step_size=1, gamma): the rate shrinks by gamma after every epoch."""
        return self.gamma ** epoch

    # --- measurement and parallelism hints ------------------------------------------------
    def _shape(self) -> dict[str, int]:
        shape = dict(data.T5_SHAPES[self.model_name])
        shape.setdefault("num_decoder_layers", shape["num_layers"])
        shape["vocab_size"] = self._vocab_size or T5_VOCABULARY
        return shape

    def flops_per_sample(self) -> float:
        """Training FLOPs of one sample at the preset's full lengths (padded, as the course
        runs it; trimmed batches do less).

        Kaplan et al. 2020 (sec. 2.1): a forward pass costs 2 FLOPs per multiply-add, one
        multiply-add per parameter per token it touches, plus the attention scores
        (Q K^T and A V: 2 x L_q x L_k x d_attn multiply-adds); backward costs twice the
        forward, so training is 6 x forward multiply-adds ("6 N D"). For an
        encoder-decoder the parameters see different tokens: the encoder's see the S
        source tokens; the decoder's see the T target tokens, except the cross-attention
        key/value projections, which read the S encoder states; the output projection sees
        T. Embedding lookups cost nothing. Checked against torch's FlopCounterMode in the
        tests (within a few per cent).
        """
        s = self._shape()
        encoder, decoder, head = self._block_macs()
        macs = s["num_layers"] * encoder + s["num_decoder_layers"] * decoder + head
        return float(6 * macs)

    def _block_macs(self) -> tuple[int, int, int]:
        """Forward multiply-adds per sample of one encoder block, one decoder block and the
        output projection (:meth:`flops_per_sample`'s terms)."""
        s = self._shape()
        d, ff, inner, V = s["d_model"], s["d_ff"], s["d_kv"] * s["num_heads"], s["vocab_size"]
        S, T = self.source_length, self.target_length
        encoder = (4 * d * inner + 2 * d * ff) * S + 2 * S * S * inner
        decoder = ((4 * d * inner + 2 * d * inner + 2 * d * ff) * T + 2 * d * inner * S
                   + 2 * T * T * inner + 2 * T * S * inner)
        return encoder, decoder, d * V * T

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """Every T5Block of the encoder and the decoder (HF's own ``_no_split_modules``).

        A T5Block returns its position bias, a view that the next block reads and nothing
        changes in place; FSDP2 cautions about any view an FSDP unit returns (an in-place
        change would skip its backward hook), once per block and rank in every run's
        output. Silenced for these blocks only; the equivalence tests compare the
        gradients that flow through it (tests/distributed/test_xsum_parallel.py)."""
        import warnings

        warnings.filterwarnings("ignore", category=UserWarning,
                                message=r"FSDP2-wrapped module \(FSDPT5Block\) returned a view")
        return [*model.encoder.block, *model.decoder.block]

    def tp_plan(self, model: nn.Module) -> dict[str, str]:
        """Megatron-style plan (Shoeybi et al. 2019, sec. 3): q/k/v and the first
        feed-forward matrix column-parallel (each rank holds some heads / some hidden
        units), o and the second feed-forward matrix row-parallel (partial sums reduced).

        Keys are dotted module paths relative to the model build_model() returns; each
        component may be an fnmatch pattern that matches one child name ("block.*"), which
        is how ``torch.distributed.tensor.parallel.parallelize_module`` reads plan keys.
        The relative-attention-bias tables (buckets x heads, only in block 0) are split by
        head too ("colwise" on an nn.Embedding shards its output dimension), so each rank
        adds the bias of its own heads.

        The strategy must also divide every T5Attention's ``n_heads`` and ``inner_dim`` by
        the TP degree: ``n_heads`` sizes the zero position bias of attention layers without
        a bias table (the decoder's cross-attention), which must match the local heads.
        """
        ffn = ["wi_0", "wi_1"] if model.config.is_gated_act else ["wi"]
        plan: dict[str, str] = {}
        layers = {"encoder": {"0": "SelfAttention", "1": None},
                  "decoder": {"0": "SelfAttention", "1": "EncDecAttention", "2": None}}
        for stack, sub in layers.items():
            for index, attention in sub.items():
                prefix = f"{stack}.block.*.layer.{index}"
                if attention:
                    for name in ("q", "k", "v"):
                        plan[f"{prefix}.{attention}.{name}"] = "colwise"
                    plan[f"{prefix}.{attention}.o"] = "rowwise"
                else:
                    for name in ffn:
                        plan[f"{prefix}.DenseReluDense.{name}"] = "colwise"
                    plan[f"{prefix}.DenseReluDense.wo"] = "rowwise"
            plan[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias"] = "colwise"
        return plan

    def prepare_tensor_parallel(self, model: nn.Module, tp_degree: int) -> None:
        """Each rank computes n_heads / tp of every attention layer: T5Attention reshapes
        with ``n_heads`` and ``inner_dim``, so both become per-rank counts."""
        from transformers.models.t5.modeling_t5 import T5Attention

        from ddl.contract.layout import check_heads

        for module in model.modules():
            if isinstance(module, T5Attention):
                check_heads(module.n_heads, tp_degree)  # the rule `ddl submit` applies too
                module.n_heads //= tp_degree
                module.inner_dim //= tp_degree

    def pipeline_splits(self, model: nn.Module) -> list[str]:
        """Every T5 block but the encoder's first may begin a stage (``ddl_xsum.pipeline``
        explains what crosses each boundary)."""
        from ddl_xsum.pipeline import split_names

        return split_names(model)

    def pipeline_costs(self, model: nn.Module) -> list[float]:
        """Forward multiply-adds of each block at the preset's full lengths, encoder blocks
        first (:meth:`_block_macs`): an encoder block sees the source's tokens (512 in the
        course), a decoder block the summary's (150), so at equal counts the encoder's
        blocks do about twice the work; the output projection counts with the last block."""
        encoder, decoder, head = self._block_macs()
        costs = [float(encoder)] * len(model.encoder.block) + \
            [float(decoder)] * len(model.decoder.block)
        costs[-1] += head
        return costs

    def pipeline_stages(self, model: nn.Module, n_stages: int) -> list[nn.Module]:
        """Runs of consecutive blocks, encoder blocks first, balanced by their work
        (:meth:`pipeline_costs`; ddl.contract.workload.balanced_cut): t5-3b at pp=2 is
        embedding + 18 encoder blocks | 6 encoder + 24 decoder blocks + output projection
        (50/50 % of the FLOPs; by block count it was 67/33 %).

        From here on batches keep the preset's full lengths instead of being trimmed:
        pipeline stages exchange buffers whose shapes are fixed at the first step."""
        from ddl_xsum.pipeline import build_stages

        from ddl.contract.workload import balanced_cut

        splits = self.pipeline_splits(model)
        if not 1 <= n_stages <= len(splits) + 1:
            from ddl.contract.errors import UsageError
            raise UsageError(f"{n_stages} pipeline stages need {n_stages - 1} split points; "
                             f"this T5 has {len(splits)} (one per block after the first); "
                             f"allowed: at most {len(splits) + 1} stages")
        self.trim_batches = False
        return build_stages(model, balanced_cut(self.pipeline_costs(model), n_stages))

    # --- ROUGE on the test split ----------------------------------------------------------
    def test_report(self, model: nn.Module, dataset: Dataset, world: Any,
                    whole_model: Any) -> dict[str, Any]:
        """ROUGE-1/2/L of greedy test summaries (:mod:`ddl_xsum.rouge`); {} with ``rouge``
        off."""
        if not self.rouge:
            return {}
        from ddl_xsum.rouge import rouge_report

        return rouge_report(self, model, dataset, world, whole_model)
