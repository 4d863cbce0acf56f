"""The one line a run prints when the loader, not the model, sets the pace (issue 23 item 2)."""

import pytest

from ddl.worker.train.epoch import LOADER_BOUND, loader_note

pytestmark = pytest.mark.unit


def test_an_epoch_mostly_waiting_for_data_names_both_rates_and_the_remedy():
    # 10 steps in 4 s, 3 of them waiting: the loader gives 10/3 batches/s, the model 10/1
    line = loader_note(epoch=2, steps=10, seconds=4.0, data_wait=3.0, workers=0)
    assert line.startswith("ddl: epoch 2 waited for data 75% of its time")
    assert "3.3 batches/s" in line and "10.0 steps/s" in line and "0 loader worker(s)" in line
    assert "--workers" in line and "\n" not in line


def test_below_the_bound_or_an_empty_epoch_says_nothing():
    assert loader_note(2, 10, 4.0, 4.0 * LOADER_BOUND * 0.99, 0) is None
    assert loader_note(2, 10, 4.0, 4.0 * LOADER_BOUND, 2) is not None
    assert loader_note(2, 0, 4.0, 3.0, 0) is None
    assert loader_note(2, 10, 0.0, 0.0, 0) is None
