"""Learning-rate schedules: the shape of the multiplier over a run's steps."""

import math

import pytest

from ddl.worker.train import lr_schedule

pytestmark = pytest.mark.unit


def _curve(shape, total=100, warmup=0, start=0.0, per_epoch=10, epoch_factor=lambda e: 1.0):
    factor = lr_schedule.make(shape, total_steps=total, steps_per_epoch=per_epoch,
                              warmup_steps=warmup, warmup_start=start,
                              epoch_factor=epoch_factor)
    return [factor(step) for step in range(total)]


def test_constant_and_workload_shapes():
    assert _curve("constant") == [1.0] * 100
    halving = _curve("workload", epoch_factor=lambda epoch: 0.5 ** epoch)
    assert halving[9] == 1.0 and halving[10] == 0.5 and halving[99] == 0.5 ** 9


def test_cosine_and_linear_decay_to_zero_at_the_last_step():
    for shape in ("cosine", "linear"):
        curve = _curve(shape, warmup=10)
        assert curve[10] == pytest.approx(1.0)  # the end of warm-up: full learning rate
        assert curve[-1] == pytest.approx(0.0, abs=1e-12)
        assert all(a >= b for a, b in zip(curve[10:], curve[11:])), shape  # never rises
    cosine = _curve("cosine", warmup=10)
    middle = 10 + (100 - 10 - 1) / 2
    assert _curve("cosine", total=100, warmup=10)[55] == pytest.approx(
        0.5 * (1 + math.cos(math.pi * (55 - 10) / 89)))
    assert cosine[int(middle)] == pytest.approx(0.5, abs=0.02)
    linear = _curve("linear", warmup=10)
    assert linear[10 + 89 // 2] == pytest.approx(1 - 44 / 89)


def test_step_decays_tenfold_at_half_and_three_quarters():
    curve = _curve("step")
    assert curve[0] == 1.0 and curve[49] == 1.0
    assert curve[50] == pytest.approx(0.1) and curve[74] == pytest.approx(0.1)
    assert curve[75] == pytest.approx(0.01) and curve[99] == pytest.approx(0.01)


def test_warm_up_rises_linearly_from_its_start():
    curve = _curve("constant", warmup=4, start=0.25)
    assert curve[:5] == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0])
    assert _curve("constant", warmup=4, start=0.0)[:2] == pytest.approx([0.0, 0.25])
    # nothing to warm up from (scaled lr = base lr): start one step in, not at full rate
    assert _curve("constant", warmup=4, start=1.0)[0] == pytest.approx(0.25)


def test_warmup_steps_and_epochs_are_exclusive():
    from ddl.contract.errors import UsageError
    from ddl.settings.config import build

    with pytest.raises(UsageError, match="--warmup-steps or --warmup-epochs"):
        build({"site": "local", "warmup_steps": 5, "warmup_epochs": 1.0})


def test_a_run_follows_the_schedule(tmp_path, synthetic_mnist):
    """Through `ddl train`: after 2 of 4 steps of a linear schedule (t = 2/3 of the way) the
    optimizer's learning rate is a third of the base, after the last step 0."""
    import json

    from conftest import run_ddl

    run_dir = tmp_path / "run"
    proc = run_ddl("train", "--site", "local", "--nproc", "1", "--preset", "tiny", "--epochs",
                   "1", "--steps-per-epoch", "4", "--checkpoint-every", "2", "--lr", "0.003",
                   "--lr-schedule", "linear", "--data-dir", str(synthetic_mnist),
                   "--run-dir", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lrs = {step: json.loads((run_dir / "checkpoints" / f"step-{step:08d}" / "trainer.json")
                            .read_text())["scheduler"]["_last_lr"][0] for step in (2, 4)}
    assert lrs[2] == pytest.approx(0.003 / 3) and lrs[4] == pytest.approx(0.0, abs=1e-12)
    assert json.loads((run_dir / "results.json").read_text())["lr"]["schedule"] == "linear"
