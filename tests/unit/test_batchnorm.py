"""ddl.contract.batchnorm: the BatchNorm variants that make runs of any layout comparable."""

import pytest
import torch
from torch import nn

from ddl.contract.batchnorm import CrossReplicaBatchNorm2d, GhostBatchNorm2d, convert

pytestmark = pytest.mark.unit


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.2), nn.ReLU(),
                        nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2)
        net[1].running_mean.fill_(0.3)
    return net


def test_convert_replaces_every_batchnorm_and_keeps_its_state():
    plain = _net()
    for kind, cls in (("ghost", GhostBatchNorm2d), ("cross_replica", CrossReplicaBatchNorm2d)):
        net = convert(_net(), kind, 8)
        bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
        assert [type(m) for m in bns] == [cls, cls]
        assert net[1].momentum == 0.2
        for key, value in plain.state_dict().items():
            torch.testing.assert_close(net.state_dict()[key], value, rtol=0, atol=0)
    assert convert(plain, "plain") is plain
    with pytest.raises(ValueError, match="allowed: plain, cross_replica, ghost"):
        convert(plain, "sync")


def test_ghost_batchnorm_is_batchnorm_group_by_group():
    """A batch of 16 through ghost BN (groups of 4) = 4 microbatches of 4 through the same
    layers one after the other: outputs, gradients and running statistics."""
    x = torch.randn(16, 3, 6, 6) * 2 + 1
    whole, pieces = convert(_net(), "ghost", 4), convert(_net(), "ghost", 4)
    y = whole(x)
    y_pieces = torch.cat([pieces(part) for part in x.split(4)])
    torch.testing.assert_close(y_pieces, y, rtol=0, atol=0)
    y.square().mean().backward()
    sum(part.square().mean() for part in y_pieces.split(4)).div(4).backward()
    for (name, a), b in zip(whole.named_parameters(), pieces.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(pieces.state_dict()[key], value, rtol=0, atol=0)
    assert int(whole[1].num_batches_tracked) == 4
    # plain BN over the whole batch differs: the groups really are normalised apart
    assert not torch.allclose(_net()(x), y, atol=1e-3)
    whole.eval(), pieces.eval()
    torch.testing.assert_close(whole(x), pieces(x))


def test_cross_replica_batchnorm_is_batchnorm_in_one_process():
    x = torch.randn(8, 3, 6, 6) * 3 + 1
    plain, synced = _net(), convert(_net(), "cross_replica")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.testing.assert_close(synced(x2), plain(x1), rtol=1e-5, atol=1e-5)
    plain(x1).sum().backward()
    synced(x2).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(synced[1].running_var, plain[1].running_var)


def test_resnet_presets_use_them():
    """The comparable presets of both ResNets get the variants; cross-replica BN is refused
    under a pipeline (its all-reduces need every rank's BN layers)."""
    from ddl.contract.errors import UsageError
    from ddl_cifar.plugin import PRESETS as CIFAR
    from ddl_cifar.workload import CifarWorkload
    from ddl_imagewoof.plugin import PRESETS as WOOF
    from ddl_imagewoof.workload import ImagewoofWorkload

    def kinds(model):
        return {type(m) for m in model.modules() if isinstance(m, nn.BatchNorm2d)}

    assert kinds(CifarWorkload(CIFAR["tiny-ghostbn"]).build_model()) == {GhostBatchNorm2d}
    assert kinds(CifarWorkload(CIFAR["tiny-syncbn"]).build_model()) == {CrossReplicaBatchNorm2d}
    ghost = ImagewoofWorkload(WOOF["tiny-ghostbn"])
    assert kinds(ghost.build_model()) == {GhostBatchNorm2d} and not ghost.augment
    assert len(ghost.pipeline_stages(ghost.build_model(), 4)) == 4
    synced = ImagewoofWorkload(WOOF["tiny-syncbn"])
    assert kinds(synced.build_model()) == {CrossReplicaBatchNorm2d} and not synced.augment
    with pytest.raises(UsageError, match="cannot run in a pipeline"):
        synced.pipeline_stages(synced.build_model(), 2)
    assert kinds(ImagewoofWorkload(WOOF["tiny"]).build_model()) == {nn.BatchNorm2d}
