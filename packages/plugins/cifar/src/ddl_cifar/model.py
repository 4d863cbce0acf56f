"""ResNet v2 (pre-activation ResNet) as Keras builds ``ResNet50V2`` / ``ResNet152V2``.

He, Zhang, Ren, Sun, "Identity Mappings in Deep Residual Networks", ECCV 2016 (arXiv
1603.05027): moving BatchNorm and ReLU in front of each convolution ("pre-activation") leaves
the shortcut path a pure identity from block to block, which is what lets very deep ResNets
train. The course builds the Keras application ``tf.keras.applications.ResNet50V2(weights=None,
input_shape=(128, 128, 3), classes=10)``; this module is that network written in PyTorch,
layer by layer, so that parameter counts and shapes match Keras exactly:

* stem: 7x7/2 convolution *with* bias and no BN/ReLU after it (in v2 the first block's
  pre-activation does that), zero padding 1, 3x3/2 max pooling;
* four stages of bottleneck blocks (1x1 -> 3x3 -> 1x1, expansion 4), ``[3, 4, 6, 3]`` for
  ResNet50 and ``[3, 8, 36, 3]`` for ResNet152;
* every block starts with BN-ReLU ("preact"); the first block of a stage has a 1x1
  projection shortcut *with bias* fed from that pre-activation, the others an identity;
* Keras puts a stage's stride 2 in the 3x3 convolution of its *last* block (torchvision's
  v1 ResNet puts it in the first); the identity shortcut of that block is then a 1x1 max
  pooling with stride 2, i.e. plain subsampling. The last stage keeps stride 1;
* the closing 1x1 convolution of a block has a bias (it is not followed by a BN);
* after the last stage a final BN-ReLU ("post_bn"), global average pooling, dense 10.

BatchNorm uses Keras' epsilon 1.001e-5. Keras' default momentum 0.99 (running = 0.99 *
running + 0.01 * batch) is PyTorch momentum 0.01; the ``bn_momentum`` option chooses. Weights
start as Keras starts them: Glorot-uniform kernels, zero biases.

Module paths are chosen for the parallelism hints: ``stem``, ``stages.0`` .. ``stages.3``
(each a Sequential of blocks ``stages.i.j``) and ``head``; the forward pass is exactly
stem -> stages -> head, so a pipeline can cut at ``stages.1`` .. ``stages.3``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# Ghost BN (tiny-ghostbn) lives in the contract, shared with the Imagewoof workload; BN over
# all data-parallel ranks is the core's --sync-bn (ddl.worker.build.sync_bn).
from ddl.contract.batchnorm import convert

KERAS_BN_EPS = 1.001e-5
EXPANSION = 4  # bottleneck: the block's output has 4x the filters of its 3x3 convolution


@dataclass(frozen=True)
class Arch:
    """The shape of a ResNet v2: stem width, per-stage filters and block counts."""

    blocks: tuple[int, ...] = (3, 4, 6, 3)
    filters: tuple[int, ...] = (64, 128, 256, 512)
    stem: int = 64
    num_classes: int = 10

    @staticmethod
    def from_options(options) -> Arch:
        return Arch(blocks=tuple(options.get("blocks", (3, 4, 6, 3))),
                    filters=tuple(options.get("filters", (64, 128, 256, 512))),
                    stem=int(options.get("stem", 64)), num_classes=10)

    def block_plan(self):
        """Yield (stage, index, in_channels, filters, stride, projection) for every block,
        in Keras' order (``stack2``: projection in the first block, stride in the last). A
        one-block stage (the tiny preset) has both in that block; Keras' stack2 would build
        two blocks there, which no Keras application uses."""
        in_ch = self.stem
        last_stage = len(self.blocks) - 1
        for s, (n, f) in enumerate(zip(self.blocks, self.filters)):
            for j in range(n):
                stride = 2 if (j == n - 1 and s != last_stage) else 1
                yield s, j, in_ch, f, stride, j == 0
                in_ch = EXPANSION * f


RESNET50 = Arch(blocks=(3, 4, 6, 3))
RESNET152 = Arch(blocks=(3, 8, 36, 3))


def _bn(channels: int, momentum: float) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=KERAS_BN_EPS, momentum=momentum)


class PreActBottleneck(nn.Module):
    """Keras ``block2``: BN-ReLU, then 1x1 -> BN-ReLU -> 3x3 (stride) -> BN-ReLU -> 1x1 (bias),
    added to the shortcut."""

    def __init__(self, in_ch: int, filters: int, stride: int, projection: bool,
                 bn_momentum: float) -> None:
        super().__init__()
        out_ch = EXPANSION * filters
        self.stride = stride
        self.preact_bn = _bn(in_ch, bn_momentum)
        # The projection sees the pre-activated input (He et al. 2016, fig. 1b / Keras).
        self.shortcut = (nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=True)
                         if projection else None)
        self.conv1 = nn.Conv2d(in_ch, filters, 1, bias=False)
        self.bn1 = _bn(filters, bn_momentum)
        self.conv2 = nn.Conv2d(filters, filters, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(filters, bn_momentum)
        self.conv3 = nn.Conv2d(filters, out_ch, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        preact = F.relu(self.preact_bn(x))
        if self.shortcut is not None:
            shortcut = self.shortcut(preact)
        elif self.stride > 1:
            shortcut = x[:, :, :: self.stride, :: self.stride]  # Keras: MaxPooling2D(1, stride)
        else:
            shortcut = x
        out = F.relu(self.bn1(self.conv1(preact)))
        out = F.relu(self.bn2(self.conv2(out)))
        return shortcut + self.conv3(out)


class Stem(nn.Module):
    """7x7/2 convolution with bias, then zero padding and 3x3/2 max pooling."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Keras pads with zeros before pooling (ZeroPadding2D + valid MaxPooling2D); torch's
        # MaxPool2d(padding=1) pads with -inf. The stem output is not yet ReLU'd and can be
        # negative, so the two differ at the border; follow Keras.
        return F.max_pool2d(F.pad(self.conv(x), (1, 1, 1, 1)), kernel_size=3, stride=2)


class Head(nn.Module):
    """Final BN-ReLU ("post_bn"), global average pooling, dense layer (logits)."""

    def __init__(self, channels: int, num_classes: int, bn_momentum: float):
        super().__init__()
        self.post_bn = _bn(channels, bn_momentum)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.post_bn(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))  # softmax is in the loss


class ResNetV2(nn.Module):
    def __init__(self, arch: Arch = RESNET50, bn_momentum: float = 0.01) -> None:
        super().__init__()
        self.arch = arch
        self.stem = Stem(arch.stem)
        stages: list[list[nn.Module]] = [[] for _ in arch.blocks]
        for s, _, in_ch, f, stride, projection in arch.block_plan():
            stages[s].append(PreActBottleneck(in_ch, f, stride, projection, bn_momentum))
        self.stages = nn.Sequential(*(nn.Sequential(*blocks) for blocks in stages))
        self.head = Head(EXPANSION * arch.filters[-1], arch.num_classes, bn_momentum)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Keras' initialisers: glorot_uniform kernels, zero biases (BN: ones and zeros)."""
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


class PipelinePiece(nn.Module):
    """Consecutive top-level parts of a ResNetV2 (``stem``, some ``stages.i``, ``head``) as
    one pipeline stage. The parts keep their module paths (``stages`` holds only its chosen
    children, under their original indices), so the pieces' state_dicts merge back into the
    full model's keys."""

    def __init__(self, net: ResNetV2, parts: list[str]) -> None:
        super().__init__()
        self.has_stem, self.has_head = "stem" in parts, "head" in parts
        if self.has_stem:
            self.stem = net.stem
        chosen = [p.split(".", 1)[1] for p in parts if p.startswith("stages.")]
        if chosen:
            self.stages = nn.Sequential(OrderedDict((i, net.stages[int(i)]) for i in chosen))
        if self.has_head:
            self.head = net.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_stem:
            x = self.stem(x)
        if hasattr(self, "stages"):
            x = self.stages(x)
        return self.head(x) if self.has_head else x


def pipeline_pieces(net: ResNetV2, starts: set[str]) -> list[PipelinePiece]:
    """Cut stem -> stages.0 .. stages.n -> head before each module path in ``starts``."""
    parts = ["stem", *(f"stages.{i}" for i in range(len(net.stages))), "head"]
    pieces: list[list[str]] = [[]]
    for part in parts:
        if part in starts and pieces[-1]:
            pieces.append([])
        pieces[-1].append(part)
    return [PipelinePiece(net, piece) for piece in pieces]


# ---------------------------------------------------------------------------
# Analytic counts (no model needed): documented in docs/workloads/cifar.md
# ---------------------------------------------------------------------------


def count_parameters(arch: Arch) -> dict[str, int]:
    """Trainable parameters and BatchNorm running statistics, by hand.

    Per block with input c, filters f (output 4f): preact BN 2c; projection c*4f + 4f (first
    block only); conv1 c*f; bn1 2f; conv2 9f^2; bn2 2f; conv3 f*4f + 4f. Stem 7*7*3*w + w;
    post BN 2*(4f_last); dense 4f_last*classes + classes. Keras' "total params" also counts
    each BN's moving mean and variance (2 per channel): ``keras_total``.
    """
    params = 7 * 7 * 3 * arch.stem + arch.stem
    bn_channels = 0
    for _, _, c, f, _, projection in arch.block_plan():
        out = EXPANSION * f
        params += 2 * c + c * f + 2 * f + 9 * f * f + 2 * f + f * out + out
        if projection:
            params += c * out + out
        bn_channels += c + 2 * f
    last = EXPANSION * arch.filters[-1]
    params += 2 * last + last * arch.num_classes + arch.num_classes
    bn_channels += last
    return {"trainable": params, "bn_running_stats": 2 * bn_channels,
            "keras_total": params + 2 * bn_channels}


def forward_macs(arch: Arch, size: int) -> int:
    """Multiply-accumulates of one forward pass at ``size`` x ``size`` input: every
    convolution (output pixels x k*k x c_in x c_out) and the dense layer. BN, ReLU, pooling
    and the residual additions are elementwise and left out, as in the usual FLOP counts."""
    return sum(forward_macs_by_part(arch, size))


def forward_macs_by_part(arch: Arch, size: int) -> list[int]:
    """:func:`forward_macs` per part in forward order: the stem, each stage, the head."""

    def conv_out(n: int, k: int, stride: int, pad: int) -> int:
        return (n + 2 * pad - k) // stride + 1

    n = conv_out(size, 7, 2, 3)
    parts = [n * n * 7 * 7 * 3 * arch.stem] + [0] * len(arch.blocks)
    n = conv_out(n, 3, 2, 1)  # zero padding 1, 3x3/2 max pooling
    for s, _, c, f, stride, projection in arch.block_plan():
        out = EXPANSION * f
        m = conv_out(n, 3, stride, 1)  # the 3x3 conv (and the block) may halve the size
        macs = n * n * c * f  # conv1 at the input resolution
        macs += m * m * 9 * f * f  # conv2
        macs += m * m * f * out  # conv3
        if projection:
            macs += m * m * c * out  # 1x1 projection with the block's stride
        parts[1 + s] += macs
        n = m
    return [*parts, EXPANSION * arch.filters[-1] * arch.num_classes]


def train_flops_per_sample(arch: Arch, size: int) -> float:
    """2 FLOPs per MAC; backward costs about twice the forward (gradients with respect to
    inputs and to weights), so training is ~3x the forward (Kaplan et al. 2020, sec. 2.1)."""
    return 3.0 * 2.0 * forward_macs(arch, size)


def build(options) -> ResNetV2:
    net = ResNetV2(Arch.from_options(options), bn_momentum=float(options.get("bn_momentum", 0.01)))
    if options.get("bn_group"):  # statistics per fixed group of samples (pipeline equivalence)
        net = convert(net, "ghost", int(options["bn_group"]))
    return net
