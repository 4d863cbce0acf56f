"""A small Vision Transformer: a patch embedding (a Conv2d with stride = kernel = patch), a
class token and learned position embeddings, pre-norm blocks of multi-head self-attention
and an MLP, a final norm and a linear head on the class token.

Initialised as timm's ViT is: truncated normal (std 0.02) for the class token, the position
embedding and every Linear weight, zeros for the Linear biases; LayerNorm and the patch
embedding keep torch's defaults. Both spellings of the initialiser appear on purpose
(``trunc_normal_`` imported from torch.nn.init, and ``nn.init.trunc_normal_``): code
written for timm or torchvision uses either.

The parameter names are what the parallelism hints refer to: ``blocks.<i>.attn.{q,k,v,out}``
and ``blocks.<i>.mlp.{fc,proj}`` (the tensor-parallel plan), ``blocks.<i>`` (FSDP units,
pipeline cut points). :class:`Stage` holds a run of blocks under those same names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.init import trunc_normal_


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
        y = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
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


class ViT(nn.Module):
    def __init__(self, image_size: int, patch: int, channels: int, classes: int,
                 d_model: int, heads: int, n_blocks: int) -> None:
        super().__init__()
        patches = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(channels, d_model, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)
        trunc_normal_(self.cls_token, std=0.02)
        trunc_normal_(self.pos_embed, std=0.02)
        self.apply(init_linear)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = embed(self, images)
        for block in self.blocks:
            x = block(x)
        return classify(self, x)


def init_linear(module: nn.Module) -> None:
    """timm's ViT init of a Linear layer: truncated normal weights, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def embed(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Patches as tokens, the class token in front, positions added: [batch, 1 + patches,
    d_model]."""
    x = model.patch_embed(images).flatten(2).transpose(1, 2)
    cls = model.cls_token.expand(x.shape[0], -1, -1)
    return torch.cat([cls, x], dim=1) + model.pos_embed


def classify(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits from the class token after the final norm."""
    return model.head(model.norm(x)[:, 0])


class Stage(nn.Module):
    """Blocks ``start`` to ``stop - 1`` of ``model``, under the full model's names
    (``blocks.3.attn.q``, not ``0.attn.q``), so the stages' state dicts merge into the
    model's. The first stage also embeds the images (``patch_embed``, ``cls_token``,
    ``pos_embed``: the same parameters, registered under the same names); the last
    applies the final norm and the head."""

    def __init__(self, model: ViT, start: int, stop: int) -> None:
        super().__init__()
        self.first, self.last = start == 0, stop == len(model.blocks)
        if self.first:
            self.patch_embed = model.patch_embed
            self.cls_token = model.cls_token  # an nn.Parameter: registered as a parameter
            self.pos_embed = model.pos_embed
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(start, stop)})
        if self.last:
            self.norm, self.head = model.norm, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = embed(self, x)
        for block in self.blocks.values():
            x = block(x)
        return classify(self, x) if self.last else x
