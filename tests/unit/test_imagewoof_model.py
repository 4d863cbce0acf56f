"""The xresnet50 of the Imagewoof workload: its size against hand arithmetic, the Bag-of-Tricks
details that are easy to get wrong, FLOPs against torch's counter, and the workload's hints."""

import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ddl_imagewoof.model import (
    Bottleneck,
    XResNet,
    XResNetConfig,
    forward_macs,
    parameter_count,
    scaled_config,
    train_flops_per_sample,
    xresnet50,
)
from ddl_imagewoof.plugin import PRESETS
from ddl_imagewoof.workload import ImagewoofWorkload

pytestmark = pytest.mark.unit

# Derived by hand in docs/workloads/imagewoof-design.md ("Parameter count"): conv weights
# c_in * c_out * k * k (no bias), BatchNorm 2 * c per layer, linear 2048 * 10 + 10.
STAGE_PARAMS = {
    "stem": 928 + 9_280 + 18_560,  # 28,768
    "pool": 0,
    "stage1": 75_008 + 2 * 70_400,  # 215,808
    "stage2": 379_392 + 3 * 280_064,  # 1,219,584
    "stage3": 1_512_448 + 5 * 1_117_184,  # 7,098,368
    "stage4": 6_039_552 + 2 * 4_462_592,  # 14,964,736
    "head": 2048 * 10 + 10,  # 20,490
}
XRESNET50_PARAMS = 23_547_754


@pytest.fixture(scope="module")
def model() -> XResNet:
    torch.manual_seed(0)
    return xresnet50(n_out=10)


def test_parameter_count_matches_hand_derivation(model):
    assert sum(STAGE_PARAMS.values()) == XRESNET50_PARAMS
    per_stage = {name: sum(p.numel() for p in child.parameters())
                 for name, child in model.named_children()}
    assert per_stage == STAGE_PARAMS
    assert sum(p.numel() for p in model.parameters()) == XRESNET50_PARAMS
    assert parameter_count(model.config) == XRESNET50_PARAMS


def test_parameter_formula_holds_for_the_tiny_model():
    workload = ImagewoofWorkload(PRESETS["tiny"])
    tiny = workload.build_model()
    assert sum(p.numel() for p in tiny.parameters()) == parameter_count(workload.model_config)
    assert workload.model_config.layers == (1, 1, 1, 1)
    assert workload.model_config.widths == (16, 32, 64, 128)


def test_stem_is_three_3x3_convs_then_maxpool(model):
    convs = [seq[0] for seq in model.stem]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (3, 32, (3, 3), (2, 2)), (32, 32, (3, 3), (1, 1)), (32, 64, (3, 3), (1, 1))]
    assert all(isinstance(seq[1], nn.BatchNorm2d) and isinstance(seq[2], nn.ReLU)
               for seq in model.stem)
    assert (model.pool.kernel_size, model.pool.stride, model.pool.padding) == (3, 2, 1)


def test_blocks_follow_resnet_b_and_d(model):
    blocks = model.blocks()
    assert [len(getattr(model, f"stage{i}")) for i in range(1, 5)] == [3, 4, 6, 3]
    assert len(blocks) == 16 and all(isinstance(b, Bottleneck) for b in blocks)
    for stage, width in zip(range(2, 5), (128, 256, 512)):
        first = getattr(model, f"stage{stage}")[0]
        reduce, middle, expand = (seq[0] for seq in first.convs)
        # ResNet-B: the stride is on the 3x3 conv
        assert reduce.stride == (1, 1) and reduce.kernel_size == (1, 1)
        assert middle.stride == (2, 2) and middle.kernel_size == (3, 3)
        assert (middle.in_channels, expand.out_channels) == (width, 4 * width)
        # ResNet-D: 2x2 average pool (ceil mode), then a stride-1 1x1 conv + BN
        pool, proj = first.shortcut
        assert isinstance(pool, nn.AvgPool2d) and pool.kernel_size == 2 and pool.ceil_mode
        assert proj[0].kernel_size == (1, 1) and proj[0].stride == (1, 1)
        assert isinstance(proj[1], nn.BatchNorm2d)
    # stage 1 keeps the resolution: shortcut is only the 64 -> 256 projection
    first = model.stage1[0]
    assert len(first.shortcut) == 1 and first.shortcut[0][0].in_channels == 64
    assert len(model.stage1[1].shortcut) == 0  # identity


def test_zero_gamma_on_the_last_bn_of_every_branch_only(model):
    last_bns = {id(b.convs[2][1]) for b in model.blocks()}
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            expected = 0.0 if id(m) in last_bns else 1.0
            assert torch.all(m.weight == expected) and torch.all(m.bias == 0)
    assert len(last_bns) == 16


def test_kaiming_normal_init(model):
    conv = model.stage4[1].convs[1][0]  # 512 x 512 x 3 x 3: 2.4 M samples
    fan_in = conv.in_channels * 9
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / fan_in), rel=0.02)
    assert conv.bias is None
    linear = model.head[-1]
    assert linear.weight.std().item() == pytest.approx(math.sqrt(2 / 2048), rel=0.1)
    assert torch.all(linear.bias == 0)


@pytest.mark.parametrize("size, last_map", [(160, 5), (150, 5), (64, 2)])
def test_output_shapes(size, last_map):
    """At 150 px stage 3 gets 19x19 maps: the strided 3x3 conv gives 10x10, and only the
    shortcut pool's ceil mode gives 10x10 too (floor would give 9x9 and fail)."""
    with torch.device("meta"):
        m = xresnet50(n_out=10)
        x = torch.empty(2, 3, size, size)
        features = nn.Sequential(*list(m.children())[:-1])(x)
        assert features.shape == (2, 2048, last_map, last_map)
        assert m(x).shape == (2, 10)


@pytest.mark.parametrize("preset", ["course", "tiny"])
def test_flops_match_torch_flop_counter(preset):
    workload = ImagewoofWorkload(PRESETS[preset])
    size = workload.image_size
    with torch.device("meta"):
        m = workload.build_model()
        x = torch.empty(4, 3, size, size)
        with FlopCounterMode(display=False) as forward:
            out = m(x)
        with FlopCounterMode(display=False) as backward:
            out.sum().backward()
    per_sample_forward = forward.get_total_flops() / 4
    assert per_sample_forward == 2 * forward_macs(workload.model_config, size)  # exact
    measured_train = per_sample_forward + backward.get_total_flops() / 4
    # backward skips the input gradient of the first conv: a little under 2x the forward
    assert measured_train == pytest.approx(workload.flops_per_sample(), rel=0.01)
    assert workload.flops_per_sample() == train_flops_per_sample(workload.model_config, size)


def test_xresnet50_flops_at_160px():
    """4.415 GFLOPs forward per 160 px image (2.2 G multiply-adds; torchvision's resnet50
    at 224 px is 4.1 G multiply-adds, x (160/224)^2 = 2.1 G plus the heavier stem)."""
    assert forward_macs(XResNetConfig(), 160) == 2_207_559_680


def test_model_runs_under_autocast():
    """No dtype-specific code: bf16 autocast on CPU (what --precision uses) just works."""
    workload = ImagewoofWorkload(PRESETS["tiny"])
    torch.manual_seed(0)
    m = workload.build_model()
    x, y = torch.randn(4, 3, 64, 64), torch.tensor([0, 1, 2, 3])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
        loss = workload.loss(out, y)
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    metrics = workload.sample_metrics(out, y)
    assert all(v.shape == (4,) and v.dtype == torch.float32 for v in metrics.values())


def test_sample_metrics_top1_and_top5():
    workload = ImagewoofWorkload(PRESETS["tiny"])
    outputs = torch.arange(10, dtype=torch.float32).repeat(3, 1)  # ranking 9, 8, 7, ...
    targets = torch.tensor([9, 5, 4])  # top-1, in the top 5, outside the top 5
    metrics = workload.sample_metrics(outputs, targets)
    assert metrics["accuracy"].tolist() == [1.0, 0.0, 0.0]
    assert metrics["top5_accuracy"].tolist() == [1.0, 1.0, 0.0]
    assert metrics["loss"].shape == (3,)


def test_parallelism_hints_name_real_modules(model):
    workload = ImagewoofWorkload(PRESETS["course"])
    units = workload.fsdp_units(model)
    assert units == model.blocks() and len(units) == 16
    names = [name for name, _ in model.named_children()]
    splits = workload.pipeline_splits(model)
    assert splits == ["stage2", "stage3", "stage4"]
    for path in splits:
        model.get_submodule(path)
    assert [names.index(s) for s in splits] == sorted(names.index(s) for s in splits)
    wrapped = nn.Module()
    wrapped.module = model  # DDP-style wrapper
    assert workload.fsdp_units(wrapped) == units


def test_optimizer_is_fastai_default_without_decay_on_bn_and_bias(model):
    optimizer = ImagewoofWorkload(PRESETS["course"]).optimizer(model.parameters(), 1e-3)
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert decay["betas"] == (0.9, 0.99) and decay["eps"] == 1e-5
    n_convs_linear = sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.modules())
    assert len(decay["params"]) == n_convs_linear
    assert all(p.ndim == 1 for p in no_decay["params"])


def test_scaled_config_keeps_the_shape():
    cfg = scaled_config(XResNetConfig(), 4, (1, 1, 1, 1))
    assert cfg.stem == (8, 8, 16) and cfg.expansion == 4 and cfg.n_out == 10
