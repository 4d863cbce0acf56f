"""benchmarks/overhead_instructions.py's arithmetic on callgrind's own file format: which
files are whose ranks and threads, a step's count as the difference of two runs, and its
bad input (one line, exit 2). The benchmark itself runs under valgrind for ~25 minutes and
is not run here; its committed result is benchmarks/results/overhead_instructions.json."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

sys.path.insert(0, str(REPO / "benchmarks"))
import overhead_instructions as oi  # noqa: E402

SCRIPT = REPO / "benchmarks" / "overhead_instructions.py"


def _callgrind_file(path, pid, command, totals, thread=None, events=("Ir",)):
    """A file as callgrind 3.19 writes it (the header, one function, the totals); a process
    killed before its dump leaves only the header."""
    lines = ["# callgrind format", "version: 1", "creator: callgrind-3.19.0", f"pid: {pid}",
             f"cmd:  {command}", "part: 1"]
    if thread is not None:
        lines.append(f"thread: {thread}")
    if totals is not None:
        lines += ["", "positions: line", f"events: {' '.join(events)}",
                  f"summary: {' '.join(map(str, totals))}", "", "fn=(1) main", "0 5", "",
                  f"totals: {' '.join(map(str, totals))}"]
    path.write_text("\n".join(lines) + "\n")


def test_a_runs_files_are_read_per_process_and_thread(tmp_path):
    ddl = ".venv/bin/python .venv/bin/ddl train --plugin mnist"
    _callgrind_file(tmp_path / "ddl-mnist-15.100.out-01", 100, ddl, [1000, 7], 1,
                    ("Ir", "D1mr"))
    _callgrind_file(tmp_path / "ddl-mnist-15.100.out-02", 100, ddl, [30, 1], 2, ("Ir", "D1mr"))
    _callgrind_file(tmp_path / "ddl-mnist-15.101.out-01", 101, ddl, None, 1)  # killed
    _callgrind_file(tmp_path / "ddl-mnist-30.100.out-01", 100, ddl, [5, 5], 1)  # other run
    (tmp_path / "ddl-mnist-15.100.log").write_text("==100== Command: ...\n")
    found = oi.process_counts(tmp_path, "ddl-mnist-15")
    assert found == {100: {"command": ddl, "threads": {1: {"Ir": 1000, "D1mr": 7},
                                                       2: {"Ir": 30, "D1mr": 1}}},
                     101: {"command": ddl, "threads": {}}}


def test_a_file_without_separate_threads_is_the_main_thread(tmp_path):
    _callgrind_file(tmp_path / "plain-mnist-15.7.out", 7, "python plain_ddp.py", [42])
    assert oi.process_counts(tmp_path, "plain-mnist-15")[7]["threads"] == {1: {"Ir": 42}}


def test_a_step_is_the_difference_of_the_two_runs_per_rank():
    processes = {1: {"threads": {1: {"Ir": 1_000}, 2: {"Ir": 10}}},
                 2: {"threads": {1: {"Ir": 1_100}, 3: {"Ir": 20}}},
                 9: {"threads": {1: {"Ir": 10 ** 9}}}}  # not a rank (the launcher)
    short = oi.rank_counts(processes, [1, 2])
    assert short == {"main": {"Ir": 2_100}, "all": {"Ir": 2_130}}
    long = {"main": {"Ir": 2_100 + 2 * 30 * 400}, "all": {"Ir": 2_130 + 2 * 30 * 410}}
    # 30 extra steps on each of 2 ranks: 400 instructions a step on each main thread
    assert oi.per_step(short, long, extra_steps=30, ranks=2) == {
        "main": {"Ir": 400.0}, "all": {"Ir": 410.0}}


def test_ranks_come_from_ddls_live_state_and_plain_command_lines(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    for rank, pid in enumerate((11, 12)):
        (live / f"rank-{rank}.json").write_text(json.dumps({"pid": pid}))
    counted = {"threads": {1: {"Ir": 1}}}
    ddl = {10: {"command": "ddl train", **counted}, 11: {"command": "ddl train", **counted},
           12: {"command": "ddl train", **counted}}
    assert oi.find_ranks("ddl", ddl, tmp_path, 2) == [11, 12]
    agent = "python -m torch.distributed.run --nproc-per-node=2 reference/plain_ddp.py"
    plain = {20: {"command": agent, **counted},
             21: {"command": "python -u reference/plain_ddp.py --steps 15", **counted},
             22: {"command": "python -u reference/plain_ddp.py --steps 15", **counted},
             23: {"command": "/sbin/ldconfig -p", **counted}}
    assert sorted(oi.find_ranks("plain", plain, tmp_path, 2)) == [21, 22]
    ddl[12]["threads"] = {}  # a rank whose counts were never written
    with pytest.raises(SystemExit, match=r"expected 2 rank processes .*none for \[12\]"):
        oi.find_ranks("ddl", ddl, tmp_path, 2)


@pytest.mark.parametrize("value", ["30", "30,15", "0,15", "a,b", "15,15"])
def test_bad_step_counts_are_one_line_and_exit_2(value):
    proc = subprocess.run([sys.executable, str(SCRIPT), f"--steps={value}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"overhead_instructions.py: error: argument --steps: {value!r}: expected two step "
        "counts A,B with 0 < A < B, e.g. 15,30")


def test_without_valgrind_it_says_so_in_one_line(tmp_path):
    (tmp_path / "bin").mkdir()  # a PATH without valgrind
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), f"--out={out}"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": str(tmp_path / "bin")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(
        "error: valgrind is not installed (Debian: apt-get install valgrind); it counts the "
        "instructions")
    assert not out.exists()
