"""BatchNorm that does not depend on how a batch is cut: ghost BN (ddl.contract.batchnorm,
pipelines) and `--sync-bn` (ddl.worker.build.sync_bn, data parallelism, any workload).

Statistics summed over 2 real ranks are checked end to end in tests/distributed/
test_cifar_train.py; here the single-process behaviour, the conversion and the refusals.
torch's SyncBatchNorm (chosen on GPU devices) is only constructed here: its forward refuses
CPU tensors, and this machine has no GPU."""

import re

import pytest
import torch
from conftest import assert_one_line_error, run_ddl
from torch import nn

from ddl.contract.batchnorm import GhostBatchNorm2d, convert
from ddl.contract.errors import UsageError
from ddl.contract.plugins import Plugins
from ddl.contract.world import World
from ddl.worker.build import sync_bn
from ddl.worker.build.sync_bn import CrossReplicaBatchNorm

pytestmark = pytest.mark.unit


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.2), nn.ReLU(),
                        nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2)
        net[1].running_mean.fill_(0.3)
    return net


def _world(device: str = "cpu", rank: int = 0) -> World:
    return World(rank=rank, local_rank=rank, size=2, device=torch.device(device),
                 backend="gloo")


def test_convert_replaces_every_batchnorm_and_keeps_its_state():
    plain = _net()
    net = convert(_net(), "ghost", 8)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert [type(m) for m in bns] == [GhostBatchNorm2d, GhostBatchNorm2d]
    assert net[1].momentum == 0.2
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(net.state_dict()[key], value, rtol=0, atol=0)
    assert convert(plain, "plain") is plain
    with pytest.raises(ValueError, match="allowed: plain, ghost"):
        convert(plain, "cross_replica")


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


def test_sync_bn_converts_every_plain_batchnorm_and_keeps_its_state():
    """CPU gets ddl's cross-replica BN, a GPU device torch's SyncBatchNorm; 1-D, 2-D and 3-D
    BatchNorm all convert; a workload's own variant (ghost BN) is left alone."""
    def model() -> nn.Module:
        net = _net()
        net.append(nn.BatchNorm1d(4))
        net.append(nn.Sequential(nn.BatchNorm3d(2), GhostBatchNorm2d(4, group=2)))
        return net

    reference = model()
    for device, cls in (("cpu", CrossReplicaBatchNorm), ("cuda", nn.SyncBatchNorm)):
        net, converted = sync_bn.convert(model(), torch.device(device))
        assert converted == 4
        kinds = [type(m) for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        assert kinds == [cls, cls, cls, cls, GhostBatchNorm2d], device
        assert net[1].momentum == 0.2 and net[1].eps == reference[1].eps
        for key, value in reference.state_dict().items():
            torch.testing.assert_close(net.state_dict()[key], value, rtol=0, atol=0)
    # a bare BatchNorm is replaced, not only its children
    bare, converted = sync_bn.convert(nn.BatchNorm2d(3), torch.device("cpu"))
    assert type(bare) is CrossReplicaBatchNorm and converted == 1


@pytest.mark.parametrize("shape", [(8, 4), (8, 4, 5), (8, 4, 5, 5)])
def test_cross_replica_batchnorm_equals_batchnorm_on_one_rank(shape):
    """No process group (one process): outputs, input gradients, running statistics and
    evaluation equal torch's plain BatchNorm of the same dimensionality."""
    plain = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[len(shape)](4, momentum=0.3)
    with torch.no_grad():
        plain.weight.copy_(torch.linspace(0.5, 2, 4))
        plain.bias.copy_(torch.linspace(-1, 1, 4))
    synced = CrossReplicaBatchNorm.from_plain(plain)
    x = torch.randn(*shape) * 3 + 1
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = plain(x1), synced(x2)
    torch.testing.assert_close(y2, y1, rtol=1e-5, atol=1e-5)
    weights = torch.arange(4.0).view(1, -1, *[1] * (len(shape) - 2))
    (y1 * weights).sum().backward()
    (y2 * weights).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(synced.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(synced.running_mean, plain.running_mean)
    torch.testing.assert_close(synced.running_var, plain.running_var)
    assert int(synced.num_batches_tracked) == 1
    plain.eval(), synced.eval()
    torch.testing.assert_close(synced(x), plain(x))


def test_sync_bn_without_batchnorm_notes_it_once(capsys):
    """A model without plain BatchNorm (MNIST's CNN, T5) trains unchanged; rank 0 says so in
    one note line, the other ranks stay quiet."""
    mlp = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    assert sync_bn.apply(mlp, _world(rank=1)) is mlp
    assert capsys.readouterr().err == ""
    assert sync_bn.apply(mlp, _world(rank=0)) is mlp
    err = capsys.readouterr().err.splitlines()
    assert err == [("ddl: note: --sync-bn: the model has no plain BatchNorm layer; nothing to "
                    "synchronise")]
    assert all(torch.equal(mlp.state_dict()[k], v) for k, v in before.items())
    assert type(sync_bn.apply(_net(), _world())[1]) is CrossReplicaBatchNorm


def test_strategies_declare_whether_they_can_sync_batchnorm():
    """Data-parallel strategies can; pipeline and tensor-parallel ones (layers differ per
    rank, or the data-parallel group is smaller than the world) refuse in one message."""
    specs = Plugins().strategies()
    assert {name for name, s in specs.items() if s.sync_bn} >= {"ddp", "fsdp", "accelerate"}
    for name in ("pp", "tp", "fsdp+tp"):
        with pytest.raises(UsageError, match=rf"--sync-bn: strategy {re.escape(name)} .*; "
                                             "allowed with: accelerate, ddp, fsdp$"):
            sync_bn.check(True, specs[name], specs.values())
        sync_bn.check(False, specs[name], specs.values())  # off: nothing to refuse
    sync_bn.check(True, specs["ddp"], specs.values())


def test_sync_bn_under_pipeline_refused_before_workers_start(tmp_path):
    """Through the real CLI: the pre-flight refuses, exit 2, one line, no run directory."""
    run_dir = tmp_path / "run"
    proc = run_ddl("train", "--plugin", "cifar", "--preset", "tiny", "--strategy", "pp",
                   "--sync-bn", "--nproc", "2", "--data-dir", str(tmp_path),
                   "--run-dir", str(run_dir), cwd=tmp_path, timeout=120)
    assert_one_line_error(proc, "--sync-bn", "strategy pp", "allowed with:", "ddp")
    assert not run_dir.exists()


def test_resnet_presets():
    """Ghost presets get ghost BN; the cross-replica presets are gone (`--sync-bn` instead);
    imagewoof's tiny-exact is tiny without random augmentation, with plain BN."""
    from ddl_cifar.plugin import PRESETS as CIFAR
    from ddl_cifar.workload import CifarWorkload
    from ddl_imagewoof.plugin import PRESETS as WOOF
    from ddl_imagewoof.workload import ImagewoofWorkload

    def kinds(model):
        return {type(m) for m in model.modules() if isinstance(m, nn.BatchNorm2d)}

    assert "tiny-syncbn" not in CIFAR and "tiny-syncbn" not in WOOF
    assert kinds(CifarWorkload(CIFAR["tiny-ghostbn"]).build_model()) == {GhostBatchNorm2d}
    assert kinds(CifarWorkload(CIFAR["tiny"]).build_model()) == {nn.BatchNorm2d}
    ghost = ImagewoofWorkload(WOOF["tiny-ghostbn"])
    assert kinds(ghost.build_model()) == {GhostBatchNorm2d} and not ghost.augment
    assert len(ghost.pipeline_stages(ghost.build_model(), 4)) == 4
    exact = ImagewoofWorkload(WOOF["tiny-exact"])
    assert kinds(exact.build_model()) == {nn.BatchNorm2d} and not exact.augment
    assert ImagewoofWorkload(WOOF["tiny"]).augment
