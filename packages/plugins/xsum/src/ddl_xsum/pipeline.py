"""T5 cut into pipeline stages.

An encoder-decoder is no chain of layers: every decoder block cross-attends to the
encoder's output under the source attention mask, the decoder's input comes from the batch
(the shifted summary), not from the encoder, and block 0 of each stack owns the relative
position table whose bias all blocks of that stack add to their attention scores. So a
stage here is a contiguous run of blocks, counting the encoder's blocks and then the
decoder's, and what crosses a stage boundary depends on where the boundary lies:

- before the first stage: the batch, ``(input_ids, attention_mask, decoder_input_ids)``;
- inside the encoder: ``(hidden, attention_mask, target_embeds)``;
- between encoder and decoder: ``(encoder_states, attention_mask, target_embeds)``;
- inside the decoder: ``(encoder_states, attention_mask, hidden)``;
- after the last stage: the logits.

The first stage embeds both the source and the summary tokens: torch's pipeline stages
learn the shapes of their inputs by running a forward on uninitialised tensors of the right
shape, and an embedding lookup in a later stage would then index with garbage. The integer
mask travels along without gradient; each stage rebuilds the attention masks from it with
the same ``transformers`` helpers ``T5Stack`` uses and calls the blocks exactly as
``T5Stack.forward`` does, so the stages compose to the model's own forward.

Weights used by several stages are held by each of them under the same name: the shared
embedding (first stage: source and summary tokens; last stage, tied: the output
projection) and the position table of a stack that spans stages (a stage without the
stack's block 0 computes the bias from its own copy of block 0's table). The pipeline
strategy finds parameters held under one name on several ranks and sums their gradients
across those ranks, which is what a single process does for a weight used in several
places. Recomputing the bias, rather than sending it along, also keeps a heads x length x
length tensor off the wire, and keeps every stage output a function of the stage's inputs
(torch's zero-bubble schedules split the backward on that assumption).

Sub-modules keep the full model's names (``encoder.block.1...``, ``lm_head``), so the stages'
state dicts merge into the model's state dict.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = ("input_ids", "attention_mask", "decoder_input_ids")
ENCODING = ("hidden", "attention_mask", "target_embeds")
ENCODED = ("encoder_states", "attention_mask", "target_embeds")
DECODING = ("encoder_states", "attention_mask", "hidden")


def split_names(model: nn.Module) -> list[str]:
    """Where a stage may begin: before any block but the encoder's first."""
    blocks = [f"encoder.block.{i}" for i in range(len(model.encoder.block))]
    blocks += [f"decoder.block.{i}" for i in range(len(model.decoder.block))]
    return blocks[1:]


class PositionTable(nn.Module):
    """Block 0's relative-position table alone, for a stage holding later blocks only."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.relative_attention_bias = attention.relative_attention_bias
        self.is_decoder = attention.is_decoder
        self.relative_attention_num_buckets = attention.relative_attention_num_buckets
        self.relative_attention_max_distance = attention.relative_attention_max_distance
        self._relative_position_bucket = type(attention)._relative_position_bucket

    def forward(self, length: int, device: torch.device) -> torch.Tensor:
        from transformers.models.t5.modeling_t5 import T5Attention

        # T5Attention's own computation, run on this object's attributes
        return T5Attention.compute_bias(self, length, length, device=device)


class StackSlice(nn.Module):
    """Blocks ``blocks`` of a ``T5Stack``, under the stack's own attribute names."""

    def __init__(self, stack: nn.Module, blocks: range, *, embeds: bool, ends: bool) -> None:
        super().__init__()
        self.config = stack.config
        if embeds:
            self.embed_tokens = stack.embed_tokens
        self.indices = [str(i) for i in blocks]
        self.block = nn.ModuleDict({str(i): stack.block[i] for i in blocks})
        if blocks and blocks[0] != 0:
            # block 0's table, at its path in the model (block.0.layer.0.SelfAttention)
            layer = nn.Module()
            layer.SelfAttention = PositionTable(stack.block[0].layer[0].SelfAttention)
            holder = nn.Module()
            holder.layer = nn.ModuleList([layer])
            self.block["0"] = holder
        if ends:
            self.final_layer_norm = stack.final_layer_norm
        self.dropout = stack.dropout
        self.embeds, self.ends = embeds, ends

    def own_blocks(self) -> list[nn.Module]:
        return [self.block[i] for i in self.indices]

    def position_bias(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """None where block 0 is here (it computes the bias itself), else the bias."""
        if not self.indices or self.indices[0] == "0":
            return None
        return self.block["0"].layer[0].SelfAttention(hidden.shape[1], hidden.device)


class T5Stage(nn.Module):
    """Blocks ``start`` to ``stop - 1`` of the encoder-then-decoder sequence of blocks."""

    def __init__(self, model: nn.Module, start: int, stop: int) -> None:
        super().__init__()
        self.config = model.config
        n_enc, n_dec = len(model.encoder.block), len(model.decoder.block)
        self.start, self.stop, self.n_enc = start, stop, n_enc
        self.first, self.last = start == 0, stop == n_enc + n_dec
        if self.first or self.last:
            self.shared = model.shared  # see the module docstring: one name on both ranks
        self.encoder = (StackSlice(model.encoder, range(start, min(stop, n_enc)),
                                   embeds=self.first, ends=stop >= n_enc)
                        if start < n_enc else None)
        decoder_blocks = range(max(start - n_enc, 0), max(stop - n_enc, 0))
        self.decoder = (StackSlice(model.decoder, decoder_blocks, embeds=self.first,
                                   ends=self.last)
                        if self.first or decoder_blocks else None)
        if self.last:
            self.lm_head = model.lm_head
            self.scale = model.config.d_model ** -0.5 if model.config.scale_decoder_outputs \
                else None

    def _boundary(self, block: int) -> tuple[str, ...]:
        if block == 0:
            return BATCH
        if block < self.n_enc:
            return ENCODING
        return ENCODED if block == self.n_enc else DECODING

    def forward(self, *carry: torch.Tensor):
        from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

        from ddl_xsum.attention_mask import prepared_mask  # (no host sync: see there)

        x = dict(zip(self._boundary(self.start), carry, strict=True))
        enc, dec = self.encoder, self.decoder
        if self.first:
            x["hidden"] = enc.dropout(enc.embed_tokens(x["input_ids"]))
            x["target_embeds"] = dec.dropout(dec.embed_tokens(x["decoder_input_ids"]))
        if enc is not None:
            hidden = x["hidden"]
            bias = enc.position_bias(hidden)
            mask = create_bidirectional_mask(config=enc.config, inputs_embeds=hidden,
                                             attention_mask=prepared_mask(x["attention_mask"]))
            for block in enc.own_blocks():
                hidden, bias, _ = block(hidden, mask, bias, None, None, None)  # no cache
            if enc.ends:
                x["encoder_states"] = enc.dropout(enc.final_layer_norm(hidden))
            else:
                x["hidden"] = hidden
        if dec is not None and dec.indices:
            hidden = x["target_embeds"] if self.start <= self.n_enc else x["hidden"]
            bias = dec.position_bias(hidden)
            states = x["encoder_states"]
            # (config, inputs_embeds, attention_mask, no cache): positional, as the cache's
            # keyword differs between transformers versions (past_key_values, now cache)
            self_mask = create_causal_mask(dec.config, hidden, None, None)
            cross_mask = create_bidirectional_mask(config=dec.config, inputs_embeds=hidden,
                                                   attention_mask=prepared_mask(
                                                       x["attention_mask"]),
                                                   encoder_hidden_states=states)
            cross_bias = None  # zeros (no table in cross-attention), made by the first block
            for block in dec.own_blocks():
                hidden, bias, cross_bias = block(hidden, self_mask, bias, states, cross_mask,
                                                 cross_bias)  # no cache (its default)
            if self.last:
                out = dec.dropout(dec.final_layer_norm(hidden))
                if self.scale is not None:
                    out = out * self.scale
                return self.lm_head(out)
            x["hidden"] = hidden
        return tuple(x[name] for name in self._boundary(self.stop))


def build_stages(model: nn.Module, cuts: list[int]) -> list[T5Stage]:
    """Stages starting at block 0 and at each index in ``cuts`` (increasing)."""
    n_blocks = len(model.encoder.block) + len(model.decoder.block)
    bounds = [0, *cuts, n_blocks]
    return [T5Stage(model, a, b) for a, b in zip(bounds, bounds[1:])]
