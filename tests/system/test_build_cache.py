"""The system tests' build cache (tests/system/build_cache.py) without Apptainer: where it
is, that its entries follow the lock's content, and that its flock keeps two sessions apart.
Unit tests (fast, one process), kept beside the module they check."""

from __future__ import annotations

import fcntl

import pytest

from .build_cache import cache_root, entry, held, prune_other_wheelhouses

pytestmark = pytest.mark.unit


def test_cache_root_is_outside_the_checkout_and_overridable(tmp_path):
    assert cache_root({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "ddl"
    assert cache_root({"HOME": "/nowhere", "XDG_CACHE_HOME": str(tmp_path / "x")}) == \
        tmp_path / "x" / "ddl"
    assert cache_root({"HOME": "/nowhere", "XDG_CACHE_HOME": "/elsewhere",
                       "DDL_TEST_CACHE": str(tmp_path / "mine")}) == tmp_path / "mine"


def test_wheelhouse_entry_follows_the_lock_content_not_its_path(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("torch==2.14.1 \\\n    --hash=sha256:aa\n")
    first = entry(tmp_path / "cache", "wheelhouse", lock)
    assert first.parent == tmp_path / "cache" and first.name.startswith("wheelhouse-")

    copy = tmp_path / "clone" / "requirements.lock"  # a fresh clone: same lock, same entry
    copy.parent.mkdir()
    copy.write_bytes(lock.read_bytes())
    assert entry(tmp_path / "cache", "wheelhouse", copy) == first

    lock.write_text("torch==2.14.2 \\\n    --hash=sha256:aa\n")  # one version moved
    assert entry(tmp_path / "cache", "wheelhouse", lock) != first


def test_held_entry_excludes_a_second_holder(tmp_path):
    target = tmp_path / "cache" / "wheelhouse-0123"
    with held(target) as path, open(target.with_name(target.name + ".lock"), "a") as other:
        assert path == target
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(target.with_name(target.name + ".lock"), "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again after the block


def test_prune_removes_other_locks_wheelhouses_unless_in_use(tmp_path):
    keep, stale, busy = (tmp_path / f"wheelhouse-{k}" for k in ("keep", "stale", "busy"))
    apptainer = tmp_path / "apptainer-0123"
    for path in (keep, stale, busy, apptainer):
        path.mkdir()
        (path / "x.whl").write_text("")
    with held(busy):
        removed = prune_other_wheelhouses(keep)
    assert removed == [stale]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == \
        ["apptainer-0123", "wheelhouse-busy", "wheelhouse-keep"]
