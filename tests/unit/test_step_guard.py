"""The step guard checks every k steps (ddl.worker.train.control.StepGuard, --check-every): a
non-finite loss between checks is kept on the device and named at the next check with the
step where it began; a check the trainer forces (before a checkpoint, at an epoch's end)
comes at once."""

import math

import pytest
import torch

from ddl.contract.world import World
from ddl.worker.train.control import StepGuard, TrainingDiverged

pytestmark = pytest.mark.unit


def _guard(tmp_path, every):
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    return StepGuard(world, tmp_path, every=every)


def test_a_bad_step_between_checks_is_named_at_the_next_check(tmp_path, capsys):
    guard = _guard(tmp_path, every=5)
    losses = {1: 0.5, 2: 0.4, 3: math.nan, 4: math.inf}
    for step, value in losses.items():  # no check yet: nothing raised, nothing printed
        assert guard.after_step(torch.tensor(value), step, 1, step, lambda: None) is None
    with pytest.raises(TrainingDiverged) as info:
        guard.after_step(torch.tensor(0.3), 5, 1, 5, lambda: "ckpt-2")
    assert "non-finite loss at step 3 " in str(info.value)
    assert "seen at the check of step 5" in str(info.value) and "ckpt-2" in str(info.value)


def test_a_forced_check_comes_at_once(tmp_path):
    guard = _guard(tmp_path, every=100)
    assert guard.after_step(torch.tensor(1.0), 1, 1, 1, lambda: None) is None
    with pytest.raises(TrainingDiverged, match="non-finite loss at step 2 "):
        guard.after_step(torch.tensor(math.nan), 2, 1, 2, lambda: None, force=True)


def test_a_stop_file_waits_for_the_check(tmp_path):
    guard = _guard(tmp_path, every=3)
    (tmp_path / "STOP").touch()
    assert guard.after_step(torch.tensor(1.0), 1, 1, 1, lambda: None) is None
    assert guard.after_step(torch.tensor(1.0), 2, 1, 2, lambda: None) is None
    assert guard.after_step(torch.tensor(1.0), 3, 1, 3, lambda: None).endswith("STOP found")
    assert not (tmp_path / "STOP").exists()  # consumed


@pytest.mark.parametrize("loss", [
    torch.tensor([0.5, math.inf]),                        # a loss that is not a scalar
    torch.tensor(math.nan, dtype=torch.bfloat16),         # bf16, as under autocast
], ids=["vector", "bf16"])
def test_any_shape_or_dtype_of_loss_is_checked(tmp_path, loss):
    guard = _guard(tmp_path, every=3)
    good = torch.ones_like(loss)
    assert guard.after_step(good, 1, 1, 1, lambda: None) is None
    assert guard.after_step(loss, 2, 1, 2, lambda: None) is None
    with pytest.raises(TrainingDiverged, match="non-finite loss at step 2 "):
        guard.after_step(good, 3, 1, 3, lambda: None)
    # the window starts again after a check: good steps pass
    guard = _guard(tmp_path, every=2)
    for step in (1, 2, 3, 4):
        assert guard.after_step(good, step, 1, step, lambda: None) is None
