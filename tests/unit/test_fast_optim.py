"""Fused optimizers (ddl.contract.fast_optim) change results only within fp32 rounding: on
a CPU, where torch has both paths, a few steps of each workload's optimizer on the MNIST
CNN end within 1e-5 of the default path's weights. ddl asks for the fused path on CUDA
only (there it has not run here: no GPU), so CPU runs keep their exact numbers."""

import pytest
import torch

from ddl.contract.fast_optim import fused_on_gpu

pytestmark = pytest.mark.unit


def _net() -> torch.nn.Module:
    from ddl_mnist.workload import MnistCNN

    return MnistCNN((8, 16))


def _train(make_optimizer, fused: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    model = _net()
    params = list(model.parameters())
    optimizer = make_optimizer(params, **({"fused": True} if fused else {}))
    data = torch.Generator().manual_seed(4)
    for _ in range(5):
        x = torch.randn(16, 1, 28, 28, generator=data)
        y = torch.randint(0, 10, (16,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name,make", [
    ("adam", lambda p, **kw: torch.optim.Adam(p, lr=1e-3, **kw)),
    ("adamw", lambda p, **kw: torch.optim.AdamW(p, lr=1e-3, betas=(0.9, 0.99), eps=1e-5,
                                                weight_decay=0.01, **kw)),
    ("sgd", lambda p, **kw: torch.optim.SGD(p, lr=0.05, **kw)),
])
def test_fused_path_agrees_with_the_default_within_rounding(name, make):
    plain, fused = _train(make, False), _train(make, True)
    moved = False
    for key, want in plain.items():
        torch.testing.assert_close(fused[key], want, rtol=1e-5, atol=1e-6, msg=key)
        moved = moved or not torch.equal(want, _initial()[key])
    assert moved, "the optimizer changed nothing: the comparison would prove nothing"


def _initial() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return _net().state_dict()


def test_cpu_and_meta_parameters_keep_the_default():
    cpu = [torch.nn.Parameter(torch.ones(2))]
    assert fused_on_gpu(cpu) == {}
    assert fused_on_gpu([{"params": cpu, "weight_decay": 0.0}]) == {}
    assert fused_on_gpu([torch.nn.Parameter(torch.ones(2, device="meta"))]) == {}
    assert fused_on_gpu([]) == {}
