"""The step guard on two real gloo ranks (ddl.worker.train.control.StepGuard): a periodic
check's all-reduce is read one step later, so its latency hides under that step; a
non-finite loss on one rank still stops both, naming the step where it began, and a stop
request still stops both at the same step, after the current window was checked. The check
of an epoch's last step is read once the steps are done (``settle``)."""

import math

import pytest

pytestmark = pytest.mark.distributed


def _guard(tmp, every):
    import torch
    import torch.distributed as dist

    from ddl.contract.world import World
    from ddl.worker.train.control import StepGuard

    world = World(rank=dist.get_rank(), local_rank=dist.get_rank(),
                  size=dist.get_world_size(), device=torch.device("cpu"), backend="gloo")
    return StepGuard(world, tmp, every=every)


def nan_on_rank_1_at_step_3(tmp: str) -> dict:
    """Steps 1..6 with --check-every 2: rank 1's loss is NaN at step 3. Returns what each
    step returned, and where the guard raised."""
    import torch
    import torch.distributed as dist

    from ddl.worker.train.control import TrainingDiverged

    guard = _guard(tmp, every=2)
    returned = []
    for step in range(1, 7):
        bad = dist.get_rank() == 1 and step == 3
        try:
            returned.append(guard.after_step(torch.tensor(math.nan if bad else 1.0), step,
                                             1, step, lambda: None))
        except TrainingDiverged as error:
            return {"returned": returned, "raised_at": step, "message": str(error)}
    return {"returned": returned, "raised_at": None}


def stop_signal_on_rank_1_at_step_3(tmp: str, nan_at_5: bool) -> dict:
    """Rank 1 gets a stop request during step 3; the check of step 4 carries it; every rank
    learns it at step 5. With ``nan_at_5`` rank 0's loss of step 5 is NaN: the stop writes
    a checkpoint, so step 5 is checked first and the run must fail instead."""
    import torch
    import torch.distributed as dist

    from ddl.worker.train import control

    guard = _guard(tmp, every=2)
    returned = []
    try:
        for step in range(1, 8):
            if dist.get_rank() == 1 and step == 3:
                control.request_stop(10)
            bad = nan_at_5 and dist.get_rank() == 0 and step == 5
            returned.append(guard.after_step(torch.tensor(math.nan if bad else 1.0), step,
                                             1, step, lambda: None))
            if returned[-1]:
                break
    except control.TrainingDiverged as error:
        return {"returned": returned, "raised": str(error)}
    finally:
        control._signalled.clear()
    return {"returned": returned, "raised": None}


def epochs_last_step(tmp: str, nan: bool, stop: bool) -> dict:
    """Steps 1..3 of a 3-step epoch with --check-every 100: only the epoch's last step is
    checked; rank 1's loss of step 2 is NaN (``nan``) or rank 1 gets a stop request at
    step 3 (``stop``)."""
    import torch
    import torch.distributed as dist

    from ddl.worker.train import control

    guard = _guard(tmp, every=100)
    returned = []
    try:
        for step in (1, 2, 3):
            if stop and dist.get_rank() == 1 and step == 3:
                control.request_stop(10)
            bad = nan and dist.get_rank() == 1 and step == 2
            returned.append(guard.after_step(torch.tensor(math.nan if bad else 1.0), step,
                                             1, step, lambda: None, last=step == 3))
        return {"returned": returned, "settled": guard.settle(1, lambda: None)}
    except control.TrainingDiverged as error:
        return {"returned": returned, "raised": str(error)}
    finally:
        control._signalled.clear()


@pytest.mark.parametrize("nan,stop", [(True, False), (False, True), (False, False)],
                         ids=["nan", "stop", "neither"])
def test_the_last_step_of_an_epoch_is_checked_once_its_steps_are_done(rank_pools, tmp_path,
                                                                      nan, stop):
    results = rank_pools[2].run(epochs_last_step, str(tmp_path), nan, stop)
    for rank, got in enumerate(results):
        assert got["returned"] == [None] * 3, (rank, got)  # nothing waited for in the steps
        if nan:
            assert "non-finite loss at step 2 (epoch 1, seen at the check of step 3) on " \
                "rank(s) 1;" in got["raised"], (rank, got)
        else:
            assert "raised" not in got, (rank, got)
            assert bool(got["settled"]) == stop, (rank, got)


def test_a_non_finite_loss_on_one_rank_stops_both_a_step_after_the_check(rank_pools,
                                                                        tmp_path):
    results = rank_pools[2].run(nan_on_rank_1_at_step_3, str(tmp_path))
    for rank, got in enumerate(results):
        assert got["raised_at"] == 5, (rank, got)  # checked at 4, read at 5
        assert got["returned"] == [None] * 4, (rank, got)
        assert "non-finite loss at step 3 " in got["message"], got
        assert "seen at the check of step 4" in got["message"] and "rank(s) 1;" in \
            got["message"], got


def test_a_stop_request_on_one_rank_stops_both_at_the_same_step(rank_pools, tmp_path):
    results = rank_pools[2].run(stop_signal_on_rank_1_at_step_3, str(tmp_path), False)
    for rank, got in enumerate(results):
        assert got["raised"] is None and got["returned"][:4] == [None] * 4, (rank, got)
        assert len(got["returned"]) == 5 and got["returned"][4], (rank, got)
    assert results[1]["returned"][4] == "SIGUSR1"  # the rank that received it names it


def test_a_stop_checks_its_own_step_before_its_checkpoint(rank_pools, tmp_path):
    results = rank_pools[2].run(stop_signal_on_rank_1_at_step_3, str(tmp_path), True)
    for rank, got in enumerate(results):
        assert got["returned"] == [None] * 4, (rank, got)
        assert got["raised"] and "non-finite loss at step 5 " in got["raised"], (rank, got)
