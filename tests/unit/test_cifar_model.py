"""ResNet v2 of the cifar workload: parameter counts derived by hand, Keras' layout, FLOPs.

The expected counts are the hand derivation in docs/workloads/cifar-design.md (per block with input
c and filters f: 2c + c*f + 2f + 9f^2 + 2f + 4f^2 + 4f, plus c*4f + 4f for a projection),
written out as numbers here so that a change to the model or to the counting code fails.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ddl_cifar import model
from ddl_cifar.plugin import PRESETS, ddl_register_workloads
from ddl_cifar.workload import CifarWorkload

pytestmark = pytest.mark.unit

# stem 9,472 + conv2 215,936 + conv3 1,220,608 + conv4 7,102,464 + conv5 14,966,784
# + post BN 4,096 + dense 20,490
RESNET50_V2_PARAMS = 23_539_850
# conv3 with 8 blocks 2,342,912; conv4 with 36 blocks 40,648,704
RESNET152_V2_PARAMS = 58_208_394
# BatchNorm channels 22,720 (ResNet50) and 71,872 (ResNet152), 2 running stats each; Keras
# counts them as non-trainable params, hence its totals 23,585,290 and 58,352,138.
RESNET50_V2_BN_STATS = 45_440
RESNET152_V2_BN_STATS = 143_744


def _counts(net):
    params = sum(p.numel() for p in net.parameters())
    stats = sum(b.numel() for name, b in net.named_buffers() if "running_" in name)
    return params, stats


@pytest.mark.parametrize("preset, params, stats", [
    ("course", RESNET50_V2_PARAMS, RESNET50_V2_BN_STATS),
    ("resnet152", RESNET152_V2_PARAMS, RESNET152_V2_BN_STATS),
])
def test_parameter_counts_match_the_hand_derivation(preset, params, stats):
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        net = CifarWorkload(PRESETS[preset]).build_model()
    assert _counts(net) == (params, stats)
    arch = model.Arch.from_options(PRESETS[preset].options)
    assert model.count_parameters(arch) == {"trainable": params, "bn_running_stats": stats,
                                            "keras_total": params + stats}


def test_keras_totals():
    """Keras' model.summary() for ResNet50V2 / ResNet152V2 with classes=10."""
    assert RESNET50_V2_PARAMS + RESNET50_V2_BN_STATS == 23_585_290
    assert RESNET152_V2_PARAMS + RESNET152_V2_BN_STATS == 58_352_138


def test_difference_to_torchvision_resnet50_v1():
    """torchvision's resnet50 is v1: no conv biases, a BN after the stem and after every
    conv3 and projection, no final BN. Our v2 adds biases on the stem (64), projections
    (256+512+1024+2048 = 3,840) and every block's last 1x1 conv (15,104): +19,008; and it has
    3,840 fewer BN channels (22,720 vs 26,560): -7,680. Net +11,328."""
    from torchvision.models import resnet50

    v1 = sum(p.numel() for p in resnet50(num_classes=10).parameters())
    assert v1 == 23_528_522
    assert RESNET50_V2_PARAMS - v1 == 19_008 - 2 * 3_840 == 11_328


def test_keras_layout_stride_in_the_last_block():
    """At 128 px: stem 64, pool 32; Keras' stack2 halves the size in the LAST block of
    conv2..conv4, conv5 keeps it: 32 -> 16 -> 8 -> 4 -> 4."""
    with torch.device("meta"):  # shapes only
        net = model.ResNetV2(model.RESNET50)
        x = net.stem(torch.zeros(1, 3, 128, 128))
    sizes = []
    assert x.shape[-2:] == (32, 32)
    for stage in net.stages:
        for j, block in enumerate(stage):
            assert (block.stride == 2) == (j == len(stage) - 1 and stage is not net.stages[-1])
            assert (block.shortcut is not None) == (j == 0)
        x = stage(x)
        sizes.append(x.shape[-1])
    assert sizes == [16, 8, 4, 4] and x.shape[1] == 2048
    assert net.head(x).shape == (1, 10)
    assert net.stem.conv.bias is not None and net.stages[0][0].conv1.bias is None


@pytest.mark.parametrize("preset", ["course", "resnet152", "tiny"])
def test_flops_match_torch_flop_counter(preset):
    """The analytic count equals what torch counts: forward exactly 2 x MACs; forward plus
    backward exactly 3x, less the input gradient of the stem that nothing needs."""
    workload = CifarWorkload(PRESETS[preset])
    arch, size = workload.arch, PRESETS[preset].options["image_size"]
    with torch.device("meta"):
        net = workload.build_model()
        x = torch.randn(2, 3, size, size)
    with FlopCounterMode(display=False) as forward:
        net(x)
    macs = model.forward_macs(arch, size)
    assert forward.get_total_flops() == 2 * 2 * macs
    with FlopCounterMode(display=False) as step:
        net(x).sum().backward()
    stem_out = (size + 6 - 7) // 2 + 1
    stem_macs = stem_out**2 * 7 * 7 * 3 * arch.stem
    assert step.get_total_flops() == 2 * (6 * macs - 2 * stem_macs)
    assert workload.flops_per_sample() == 6 * macs


def test_course_flops_value():
    assert model.forward_macs(model.RESNET50, 128) == 1_136_414_720
    assert CifarWorkload(PRESETS["course"]).flops_per_sample() == pytest.approx(6.82e9, rel=1e-3)


def test_parallelism_hints_name_real_modules():
    workload = CifarWorkload(PRESETS["course"])
    with torch.device("meta"):
        net = workload.build_model()
    modules = dict(net.named_modules())
    splits = workload.pipeline_splits(net)
    assert splits == ["stages.1", "stages.2", "stages.3"]
    assert all(name in modules for name in splits)
    units = workload.fsdp_units(net)
    assert len(units) == 16
    assert all(isinstance(u, model.PreActBottleneck) for u in units)
    (spec,) = ddl_register_workloads()
    assert spec.capabilities == {"fsdp_units", "pipeline_splits"}  # no tp_plan: not for a CNN


@pytest.mark.parametrize("n_stages", [2, 3, 4])
def test_pipeline_stages_compose_to_the_model(n_stages):
    """The pieces, run in order, are the model; their state_dicts merge into its keys (the
    pipeline strategy exports weights that way)."""
    workload = CifarWorkload(PRESETS["tiny"])
    torch.manual_seed(0)
    net = workload.build_model().eval()
    pieces = workload.pipeline_stages(net, n_stages)
    assert len(pieces) == n_stages
    x = torch.randn(4, 3, 32, 32)
    y = x
    for piece in pieces:
        y = piece(y)
    torch.testing.assert_close(y, net(x), rtol=0, atol=0)
    keys = [k for piece in pieces for k in piece.state_dict()]
    assert sorted(keys) == sorted(net.state_dict())


def test_pipeline_stage_limits():
    from ddl.contract.errors import UsageError

    workload = CifarWorkload(PRESETS["tiny"])
    net = workload.build_model()
    with pytest.raises(UsageError, match="at most 4 stages"):
        workload.pipeline_stages(net, 5)
