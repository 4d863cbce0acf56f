"""Channels-last convolutions (``Workload.channels_last``, applied by ddl on CUDA only)
change results only within fp32 rounding: on a CPU, where torch has both memory orders,
three SGD steps of the CIFAR ResNet and the Imagewoof xresnet (tiny presets) in NHWC end
within 1e-4 of the NCHW run's weights, with outputs of the same values. The CUDA path
(cuDNN) has not run here."""

import pytest
import torch

from ddl.contract.plugins import Plugins

pytestmark = pytest.mark.unit


def _train(workload, channels_last: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    model = workload.build_model()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(6)
    for _ in range(3):
        x = torch.randn(4, 3, 64, 64, generator=data)
        y = torch.randint(0, 10, (4,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if channels_last:  # the layout really was NHWC
        assert any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)
                   and not p.is_contiguous() for p in model.parameters())
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("plugin", ["cifar", "imagewoof"])
def test_nhwc_trains_like_nchw(plugin):
    spec = Plugins().workload(plugin)
    workload = spec.create(spec.presets["tiny"])
    assert workload.channels_last
    plain, nhwc = _train(workload, False), _train(workload, True)
    for key, want in plain.items():
        torch.testing.assert_close(nhwc[key], want, rtol=1e-4, atol=1e-5, msg=key)
