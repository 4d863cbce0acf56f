"""The parallel phase's scheduler (tests/worker_schedule.py) never splits a costly module."""

import pytest

from conftest import REPO
from worker_schedule import KEEP_TOGETHER, may_cut, nearest_cut

pytestmark = pytest.mark.unit

KEPT = next(iter(KEEP_TOGETHER))
IDS = [f"tests/unit/test_a.py::test_{i}" for i in range(3)] + \
      [f"{KEPT}::test_{i}" for i in range(4)] + \
      [f"tests/unit/test_b.py::test_{i}" for i in range(3)]


def test_cuts_fall_outside_a_kept_module_and_anywhere_else():
    queue = list(range(len(IDS)))
    assert [at for at in range(1, len(queue)) if not may_cut(IDS, queue, at)] == [4, 5, 6]
    assert nearest_cut(IDS, queue, 5, 1) == 7  # 3 and 7 are as near: the later one
    assert nearest_cut(IDS, queue, 4, 1) == 3
    assert nearest_cut(IDS, queue, 8, 2) == 8


def test_a_queue_inside_one_kept_module_is_not_cut():
    queue = [3, 4, 5, 6]  # the kept module alone
    assert nearest_cut(IDS, queue, 2, 2) is None


def test_a_queue_that_is_not_contiguous_is_judged_by_its_neighbours():
    queue = [0, 5, 6, 8]  # tests stolen earlier come back in any order
    assert may_cut(IDS, queue, 1) and not may_cut(IDS, queue, 2) and may_cut(IDS, queue, 3)


@pytest.mark.parametrize("module", sorted(KEEP_TOGETHER))
def test_every_kept_module_exists_and_has_a_module_fixture(module):
    source = (REPO / module).read_text()
    assert 'scope="module"' in source, f"{module}: no module fixture left to keep together"
