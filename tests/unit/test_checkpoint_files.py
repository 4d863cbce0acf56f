"""Which checkpoint a resume picks, on disk states a crash can leave; key renaming."""

import json

import pytest

from ddl.contract import state_names
from ddl.worker.checkpointing import checkpoint
from ddl.contract.errors import UsageError

pytestmark = pytest.mark.unit


def _complete(root, step):
    path = root / "checkpoints" / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"x")
    (path / "trainer.json").write_text(json.dumps({"step": step}))
    return path


def test_latest_follows_the_pointer(tmp_path):
    _complete(tmp_path, 4)
    eight = _complete(tmp_path, 8)
    (tmp_path / "checkpoints" / "latest").write_text("step-00000008")
    assert checkpoint.latest(tmp_path) == eight


def test_latest_ignores_partial_and_incomplete_directories(tmp_path):
    """Killed mid-save: a .partial dir, or (killed between rename and pointer) a pointer that
    lags; a step dir without trainer.json is never complete."""
    four = _complete(tmp_path, 4)
    (tmp_path / "checkpoints" / ".step-00000008.partial").mkdir()
    broken = tmp_path / "checkpoints" / "step-00000012"
    broken.mkdir()
    (broken / ".metadata").write_bytes(b"x")  # no trainer.json
    (tmp_path / "checkpoints" / "latest").write_text("step-00000004")
    assert checkpoint.latest(tmp_path) == four
    (tmp_path / "checkpoints" / "latest").write_text("step-00000012")  # points at garbage
    assert checkpoint.latest(tmp_path) == four


def test_pointer_lagging_behind_a_complete_newer_step_is_trusted_only_if_valid(tmp_path):
    _complete(tmp_path, 4)
    eight = _complete(tmp_path, 8)
    (tmp_path / "checkpoints" / "latest").unlink(missing_ok=True)
    assert checkpoint.latest(tmp_path) == eight


def test_resolve(tmp_path):
    assert checkpoint.resolve("none", tmp_path) is None
    assert checkpoint.resolve("auto", tmp_path) is None  # nothing yet: start from step 0
    four = _complete(tmp_path, 4)
    assert checkpoint.resolve("auto", tmp_path) == four
    assert checkpoint.resolve(str(tmp_path), tmp_path / "other") == four  # a run dir
    assert checkpoint.resolve(str(four), tmp_path / "other") == four  # a checkpoint
    with pytest.raises(UsageError, match="--resume: .* neither a complete checkpoint"):
        checkpoint.resolve(str(tmp_path / "missing"), tmp_path)


def test_rename_state_round_trip_with_flattened_optimizer_keys():
    state = {"model": {"0.block.weight": 1, "0.block.bias": 2, "1.head.weight": 3},
             "optim": {"state.0.block.weight.exp_avg": 4, "state.1.head.weight.step": 5,
                       "param_groups.0.block.bias.lr": 6}}
    renamed, back = state_names.rename_state(state, lambda fqn: fqn.split(".", 1)[1])
    assert renamed == {"model": {"block.weight": 1, "block.bias": 2, "head.weight": 3},
                       "optim": {"state.block.weight.exp_avg": 4, "state.head.weight.step": 5,
                                 "param_groups.block.bias.lr": 6}}
    assert state_names.restore_names(renamed, back) == state


def test_rng_states_survive_a_weights_only_round_trip(tmp_path):
    import random

    import numpy as np
    import torch

    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    path = tmp_path / "rng.pt"
    torch.save(checkpoint.rng_states(), path)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    checkpoint.set_rng_states(torch.load(path, weights_only=True))
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_leftovers_of_killed_saves_are_removed_and_nothing_else(tmp_path):
    """A .step-N.partial stays for ever when the resumed run saves other steps (another
    --checkpoint-every): a run's start removes its own leftovers (issue 43, item 11), only
    those exact names, never through a link."""
    root = tmp_path / "checkpoints"
    kept = _complete(tmp_path, 4)
    partial = root / ".step-00000007.partial"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"x" * 100)
    (root / ".latest.tmp").write_text("step-00000004")
    (root / "latest").write_text("step-00000004")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.me").write_text("x")
    (root / ".step-00000009.partial").symlink_to(outside)  # a link: left alone
    (root / ".step-12.partial").mkdir()  # not a name ddl writes
    (root / ".hidden").write_text("x")
    assert checkpoint.remove_leftovers(tmp_path) == [".latest.tmp", ".step-00000007.partial"]
    assert sorted(p.name for p in root.iterdir()) == [
        ".hidden", ".step-00000009.partial", ".step-12.partial", "latest", kept.name]
    assert (outside / "keep.me").is_file()
    assert checkpoint.remove_leftovers(tmp_path / "nowhere") == []


def test_pruning_keeps_the_checkpoint_just_written(tmp_path):
    """A resume that skipped a damaged newer checkpoint writes lower steps: that newer one
    is pruned, not the new one (with --keep-checkpoints 1 it used to be the new one)."""
    root = tmp_path / "checkpoints"
    _complete(tmp_path, 4)
    five = _complete(tmp_path, 5)
    _complete(tmp_path, 8)  # abandoned: the resume started from step 4
    checkpoint._prune(root, 1, five)
    assert [p.name for p in root.iterdir()] == [five.name]


def test_resume_refuses_a_position_beyond_this_runs_epoch(tmp_path):
    """Stopped after batch 5 of an 8-step epoch, resumed with --steps-per-epoch 4: one line,
    exit 2, instead of skipping the epoch (issue 43, item 9)."""
    from types import SimpleNamespace

    from ddl.worker.checkpointing import resume

    path = tmp_path / "checkpoints" / "step-00000005"
    path.mkdir(parents=True)
    (path / "trainer.json").write_text(json.dumps(checkpoint.TrainerState(
        step=5, epoch=1, position=5, global_batch=8, world_size=1, plugin="mnist",
        preset="tiny", steps_per_epoch=8).__dict__))
    run = SimpleNamespace(
        config=SimpleNamespace(plugin="mnist", resume="auto"), run_dir=tmp_path,
        numbers=SimpleNamespace(preset="tiny", global_batch=8, steps_per_epoch=4, epochs=2))
    with pytest.raises(UsageError, match="stopped after batch 5 of epoch 1, but this run has "
                                         "4 steps per epoch"):
        resume._load(path, run)
