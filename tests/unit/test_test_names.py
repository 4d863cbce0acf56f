"""Test modules have unique basenames: pytest imports them by basename (no __init__.py,
rootdir on sys.path), so tests/unit/x.py and tests/distributed/x.py cannot both be
collected in one run (a CI failure of 2026-11-26: "import file mismatch")."""

from collections import Counter

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit


def test_every_test_module_basename_is_unique():
    names = Counter(p.name for p in (REPO / "tests").rglob("test_*.py"))
    assert not [n for n, count in names.items() if count > 1]
