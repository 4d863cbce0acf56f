"""tests/shared_data.py: a shared synthetic set is written once however many workers ask at
the same moment, is never seen half-written, and a failed write leaves nothing behind."""

import threading

import pytest

from shared_data import written_once_in

pytestmark = pytest.mark.unit


def test_concurrent_askers_get_one_complete_copy(tmp_path):
    calls = []
    inside = threading.Event()
    release = threading.Event()

    def write(root):
        calls.append(root)
        (root / "part-1").write_text("a")
        inside.set()
        release.wait(30)  # the other asker arrives while this write is half done
        (root / "part-2").write_text("b")

    seen = {}

    def ask(who):
        target = written_once_in(tmp_path, "set", write)
        seen[who] = sorted(p.name for p in target.iterdir())

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=ask, args=("second",))
    second.start()  # blocks on the lock (flock: one open file description per open())
    assert not (tmp_path / "shared-set").exists()  # not renamed into place while half done
    release.set()
    first.join(30)
    second.join(30)
    assert len(calls) == 1
    assert seen == {"first": ["part-1", "part-2"], "second": ["part-1", "part-2"]}


def test_a_failed_write_leaves_nothing_and_the_next_asker_writes(tmp_path):
    def broken(root):
        (root / "half").write_text("x")
        raise RuntimeError("generator broke")

    with pytest.raises(RuntimeError, match="generator broke"):
        written_once_in(tmp_path, "set", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared-set.lock"]
    target = written_once_in(tmp_path, "set", lambda root: (root / "ok").write_text("y"))
    assert [p.name for p in target.iterdir()] == ["ok"]
