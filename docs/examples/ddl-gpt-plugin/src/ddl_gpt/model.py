"""A small GPT: token and position embeddings, pre-norm blocks of causal self-attention and
an MLP, a final norm and an output projection tied to the token embedding.

The parameter names are what the parallelism hints refer to: ``blocks.<i>.attn.{q,k,v,out}``
and ``blocks.<i>.mlp.{fc,proj}`` (the tensor-parallel plan), ``blocks.<i>`` (FSDP units,
pipeline cut points). :class:`Stage` holds a run of blocks under those same names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads  # per rank: prepare_tensor_parallel divides it by the tp degree
        self.q, self.v = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        # no key bias: it adds one number to all of a query's scores, which softmax ignores;
        # its gradient would be rounding noise, and Adam turns noise into full-size steps
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # the projections' width is this rank's share of the heads under tensor parallelism
        q, k, v = (proj(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int, heads: int, n_blocks: int):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(d_model)
        for embedding in (self.tok_emb, self.pos_emb):  # N(0, 1) would swamp the tied head
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = embed(self, ids)
        for block in self.blocks:
            x = block(x)
        return head(self, x)


def embed(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids.shape[1], device=ids.device)
    return model.tok_emb(ids) + model.pos_emb(positions)


def head(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits through the tied output projection: the token embedding's own matrix."""
    return F.linear(model.norm(x), model.tok_emb.weight)


class Stage(nn.Module):
    """Blocks ``start`` to ``stop - 1`` of ``model``, under the full model's names
    (``blocks.3.attn.q``, not ``0.attn.q``), so the stages' state dicts merge into the
    model's. The first stage also embeds the tokens; the last applies the final norm and
    the tied head, and so holds ``tok_emb`` too: ddl's pipeline sums the gradients of a
    parameter that several stages hold under one name, as one process sums its two uses."""

    def __init__(self, model: GPT, start: int, stop: int) -> None:
        super().__init__()
        self.first, self.last = start == 0, stop == len(model.blocks)
        if self.first or self.last:
            self.tok_emb = model.tok_emb
        if self.first:
            self.pos_emb = model.pos_emb
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(start, stop)})
        if self.last:
            self.norm = model.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = embed(self, x)
        for block in self.blocks.values():
            x = block(x)
        return head(self, x) if self.last else x
