"""xresnet: ResNet with the "Bag of Tricks" tweaks, as fastai's ``xresnet50`` builds it.

Written from the published description, not from fastai's code (no fastai dependency):

  He, Zhang, Zhang, Xie, Li, Li: "Bag of Tricks for Image Classification with Convolutional
  Neural Networks", CVPR 2019 (arXiv:1812.01187), section 4 "Model Tweaks", figure 2:

  * ResNet-B: in a downsampling bottleneck the stride sits on the 3x3 conv, not on the first
    1x1 conv (a strided 1x1 conv ignores 3/4 of its input).
  * ResNet-C: the 7x7 stem conv is replaced by three 3x3 convs (c_in->32 stride 2, 32->32,
    32->64), each conv-BN-ReLU, followed by the usual 3x3 max pool with stride 2.
  * ResNet-D: the downsampling shortcut is a 2x2 average pool (stride 2) followed by a 1x1
    conv + BN, instead of a strided 1x1 conv that drops 3/4 of the activations.

  Plus, from the same paper's training refinements (section 3.1 "zero gamma", after Goyal et
  al. 2017): the last BatchNorm of every residual branch starts with gamma = 0, so each block
  begins as the identity and the deep network trains like a shallow one at first.

fastai's specifics followed here: stem widths (32, 32, 64); bottleneck widths 64, 128, 256,
512 with expansion 4; the first stage's shortcut is a 1x1 conv + BN from 64 to 256 channels
(no pool: stride 1); the pool uses ``ceil_mode=True`` so odd feature maps (e.g. 19x19 in
stage 3 at 150 px input) keep their last row/column; convs followed by BN have no bias; every conv and the
final linear layer get Kaiming-normal weights (He et al. 2015, fan-in, ReLU gain) and zero
biases; the head is adaptive average pool, flatten, dropout (p = 0 by default) and a linear
layer.

The model is an ``nn.Sequential`` with named children (``stem``, ``pool``, ``stage1`` ..
``stage4``, ``head``), so pipeline split points and FSDP units are plain module paths. There
is no dtype-specific code: it runs unchanged under ``torch.autocast`` (BatchNorm then stays in
float32, as autocast decides).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class XResNetConfig:
    """The sizes that define an xresnet; ``xresnet50`` is the default."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck blocks per stage (ResNet-50)
    widths: tuple[int, ...] = (64, 128, 256, 512)  # bottleneck (3x3 conv) widths per stage
    stem: tuple[int, ...] = (32, 32, 64)  # fastai's stem_szs
    expansion: int = 4
    c_in: int = 3
    n_out: int = 10
    dropout: float = 0.0


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, *, relu: bool = True,
            zero_gamma: bool = False) -> nn.Sequential:
    """conv (no bias: the BN shift replaces it) -> BN -> optional ReLU."""
    bn = nn.BatchNorm2d(c_out)
    nn.init.constant_(bn.weight, 0.0 if zero_gamma else 1.0)
    nn.init.zeros_(bn.bias)
    parts = [nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False), bn]
    if relu:
        parts.append(nn.ReLU(inplace=True))
    return nn.Sequential(*parts)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride: ResNet-B) -> 1x1 expand (zero-gamma BN), plus
    the shortcut (ResNet-D: avg pool, then 1x1 conv + BN when the width changes)."""

    def __init__(self, c_in: int, width: int, stride: int, expansion: int) -> None:
        super().__init__()
        c_out = width * expansion
        self.convs = nn.Sequential(
            conv_bn(c_in, width, 1),
            conv_bn(width, width, 3, stride),
            conv_bn(width, c_out, 1, relu=False, zero_gamma=True),
        )
        shortcut: list[nn.Module] = []
        if stride != 1:
            # ceil_mode keeps the last row/column of odd-sized maps, matching the 3x3 conv
            # path's output size (e.g. 19x19 -> 10x10).
            shortcut.append(nn.AvgPool2d(stride, ceil_mode=True))
        if c_in != c_out:
            shortcut.append(conv_bn(c_in, c_out, 1, relu=False))
        self.shortcut = nn.Sequential(*shortcut)  # empty Sequential = identity
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.convs(x) + self.shortcut(x))


class XResNet(nn.Sequential):
    def __init__(self, config: XResNetConfig = XResNetConfig()) -> None:
        cfg = config
        stem_sizes = (cfg.c_in, *cfg.stem)
        stem = nn.Sequential(*[
            conv_bn(stem_sizes[i], stem_sizes[i + 1], 3, stride=2 if i == 0 else 1)
            for i in range(len(cfg.stem))
        ])
        parts: list[tuple[str, nn.Module]] = [
            ("stem", stem), ("pool", nn.MaxPool2d(3, stride=2, padding=1))]
        c_in = cfg.stem[-1]
        for s, (blocks, width) in enumerate(zip(cfg.layers, cfg.widths)):
            stage = []
            for b in range(blocks):
                stride = 2 if (s > 0 and b == 0) else 1  # stage 1 follows the max pool
                stage.append(Bottleneck(c_in, width, stride, cfg.expansion))
                c_in = width * cfg.expansion
            parts.append((f"stage{s + 1}", nn.Sequential(*stage)))
        parts.append(("head", nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(cfg.dropout),
            nn.Linear(c_in, cfg.n_out))))
        super().__init__(OrderedDict(parts))
        self.config = cfg
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)  # He et al. 2015: fan_in, ReLU gain
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def blocks(self) -> list[nn.Module]:
        """Every residual block, in order (the FSDP units)."""
        return [block for name, stage in self.named_children() if name.startswith("stage")
                for block in stage]


def xresnet50(n_out: int = 10, **kw) -> XResNet:
    return XResNet(XResNetConfig(n_out=n_out, **kw))


# ---------------------------------------------------------------------------------------
# Arithmetic: parameters and multiply-accumulates from the configuration alone
# ---------------------------------------------------------------------------------------


def _conv_out(size: int, kernel: int, stride: int) -> int:
    pad = kernel // 2
    return (size + 2 * pad - kernel) // stride + 1


def forward_macs(cfg: XResNetConfig, image_size: int) -> int:
    """Multiply-accumulates of one forward pass of a square ``image_size`` input, counting
    convolutions and the linear layer (BN, ReLU, pooling and the residual add are
    elementwise and <1 % of the total; FLOP counters such as torch's FlopCounterMode skip
    them too)."""
    return sum(forward_macs_by_part(cfg, image_size))


def forward_macs_by_part(cfg: XResNetConfig, image_size: int) -> list[int]:
    """:func:`forward_macs` per part in forward order: the stem, each stage, the head."""
    h = image_size
    macs = 0
    stem_sizes = (cfg.c_in, *cfg.stem)
    for i in range(len(cfg.stem)):
        h = _conv_out(h, 3, 2 if i == 0 else 1)
        macs += h * h * stem_sizes[i] * stem_sizes[i + 1] * 9
    parts = [macs]
    h = _conv_out(h, 3, 2)  # max pool
    c_in = cfg.stem[-1]
    for s, (blocks, width) in enumerate(zip(cfg.layers, cfg.widths)):
        c_out = width * cfg.expansion
        macs = 0
        for b in range(blocks):
            stride = 2 if (s > 0 and b == 0) else 1
            macs += h * h * c_in * width  # 1x1 reduce, at the input resolution
            h_out = _conv_out(h, 3, stride)
            macs += h_out * h_out * width * width * 9  # 3x3, strided
            macs += h_out * h_out * width * c_out  # 1x1 expand
            if c_in != c_out:
                macs += h_out * h_out * c_in * c_out  # shortcut 1x1 after the pool
            h, c_in = h_out, c_out
        parts.append(macs)
    return [*parts, c_in * cfg.n_out]


def train_flops_per_sample(cfg: XResNetConfig, image_size: int) -> float:
    """2 FLOPs per multiply-accumulate; backward costs about twice the forward (gradients
    with respect to inputs and to weights), so a training step is ~3x the forward."""
    return 3.0 * 2.0 * forward_macs(cfg, image_size)


def parameter_count(cfg: XResNetConfig) -> int:
    """Parameters from the configuration: conv weights, BN weight + bias, linear + bias."""
    def conv_bn_params(c_in: int, c_out: int, kernel: int) -> int:
        return c_in * c_out * kernel * kernel + 2 * c_out

    total = 0
    stem_sizes = (cfg.c_in, *cfg.stem)
    for i in range(len(cfg.stem)):
        total += conv_bn_params(stem_sizes[i], stem_sizes[i + 1], 3)
    c_in = cfg.stem[-1]
    for blocks, width in zip(cfg.layers, cfg.widths):
        c_out = width * cfg.expansion
        for _ in range(blocks):
            total += (conv_bn_params(c_in, width, 1) + conv_bn_params(width, width, 3)
                      + conv_bn_params(width, c_out, 1))
            if c_in != c_out:
                total += conv_bn_params(c_in, c_out, 1)
            c_in = c_out
    return total + c_in * cfg.n_out + cfg.n_out


def scaled_config(cfg: XResNetConfig, divisor: int, layers: Sequence[int]) -> XResNetConfig:
    """A narrower, shallower xresnet of the same shape (for CPU tests)."""
    return XResNetConfig(layers=tuple(layers),
                         widths=tuple(max(1, math.ceil(w / divisor)) for w in cfg.widths),
                         stem=tuple(max(1, math.ceil(w / divisor)) for w in cfg.stem),
                         expansion=cfg.expansion, c_in=cfg.c_in, n_out=cfg.n_out,
                         dropout=cfg.dropout)
