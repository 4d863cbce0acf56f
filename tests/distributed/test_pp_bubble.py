"""The pipeline bubble ddl reports matches (p-1)/(v*m+p-1) on a balanced split.

Runs benchmarks/pp_bubble.py small: 2 real processes over gloo, ddl's pipeline strategy with
its schedules, p2p hand-offs and compute timers, on a chain of equal blocks. The reported
idle fraction is a ratio of two times measured in the same run.

The bubble is checked against theory with ``--compute accelerator``: each layer holds the
host for a fixed time, as a host waits for its GPU, so the split is balanced by construction
and the CPU is free for the hand-offs (40 ms per layer forward: measured 1-5 % above theory
on one quiet VM, 17-23 % on another; the bar here is 40 %, the issue's 10 % is for a GPU
node, where benchmarks/pp_bubble.py runs in the GPU kit). This stands in for a GPU node (none
here); the schedule, the communication and the timers are the real ones. With real matmuls on this 2-core VM
(``--compute matmul``) op times vary by 10-20 % and each hand-off waits for the OS
scheduler, so that run is held to a wide bar (0.75-2x theory) that still catches a broken
timer; benchmarks/pp_bubble.py --compute matmul records the CPU numbers.
"""

import json
import queue
import subprocess
import sys
import threading

import pytest

from conftest import REPO

# serial: the bubble is a ratio of times, read with no other test on the CPU
pytestmark = [pytest.mark.distributed, pytest.mark.serial]


def _command(out, *args):
    return [sys.executable, str(REPO / "benchmarks" / "pp_bubble.py"), "--steps", "3",
            "--out", str(out), *args]


def _bubble(tmp_path, *args):
    out = tmp_path / "bubble.json"
    proc = subprocess.run(_command(out, *args), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["runs"]
    return row


ACCELERATOR_RUNS = [("gpipe", 4, 1), ("1f1b", 8, 1), ("interleaved1f1b", 4, 2)]


@pytest.fixture(scope="module")
def accelerator_rows(tmp_path_factory):
    """The three accelerator-compute runs side by side (each holds the host in sleeps, so
    they share the two cores without waiting for them: side by side 1.0-3.2 % above theory
    in 3 runs, alone 1-5 %), their timed steps started together (--start-together): 22 s
    (27 s while the workers were spawned, not forked), not 53 s one after the other. A run
    that fails stops the others."""
    where = tmp_path_factory.mktemp("bubble")
    procs = {}
    for schedule, microbatches, _ in ACCELERATOR_RUNS:
        procs[schedule] = subprocess.Popen(
            _command(where / f"{schedule}.json", "--compute", "accelerator", "--schedules",
                     schedule, "--microbatches", str(microbatches), "--start-together",
                     f"{where}:{len(ACCELERATOR_RUNS)}"),
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finished: queue.Queue = queue.Queue()
    for schedule, proc in procs.items():
        threading.Thread(target=lambda s=schedule, p=proc: finished.put(
            (s, p.communicate(timeout=600)[0])), daemon=True).start()
    outputs = {}
    try:
        while len(outputs) < len(procs):
            schedule, output = finished.get(timeout=660)
            outputs[schedule] = output
            assert procs[schedule].returncode == 0, f"{schedule}:\n{output}"
    finally:
        for proc in procs.values():
            proc.kill()
    return {schedule: json.loads((where / f"{schedule}.json").read_text())["runs"][0]
            for schedule in procs}


@pytest.mark.parametrize("schedule, microbatches, v", ACCELERATOR_RUNS)
def test_bubble_near_theory_on_a_balanced_split(accelerator_rows, schedule, microbatches, v):
    row = accelerator_rows[schedule]
    assert (row["schedule"], row["stages_per_rank"], row["microbatches"]) == \
        (schedule, v, microbatches)
    theory = 1 / (v * microbatches + 1)  # p = 2
    assert row["bubble_theory"] == pytest.approx(theory)
    # The theory counts no communication; here each hand-off is a gloo send between two
    # processes on a 2-vCPU VM. On the machine of 2026-11-27 the bubble read 1-5 % above
    # theory; on the Intel Xeon of 2026-11-29 17-23 % above, the same with ddl's code
    # before and after the trainer took over the step (both measured: 0.130 and 0.137 for
    # 0.111, 1F1B m=8), and 27 % with other work on the machine (interleaved, 2026-11-29).
    # 40 %: a window that missed the idle time (0) or counted a whole stage's wait (2x)
    # still fails; the 10 % bar is the GPU kit's (benchmarks/pp_bubble.py on a GPU node).
    assert row["bubble_measured"] == pytest.approx(theory, rel=0.4), row
    for measured in row["bubble_measured_per_rank"]:  # every rank, not just the mean
        assert measured == pytest.approx(theory, rel=0.4), row


def test_bubble_with_cpu_matmuls_is_near_theory(tmp_path):
    row = _bubble(tmp_path, "--compute", "matmul", "--schedules", "gpipe",
                  "--microbatches", "4")
    theory = 0.2
    # Quiet runs read 0.22-0.25, a loaded CI machine 0.27 (hand-offs wait for the OS
    # scheduler, op times vary), so this bar is wide on purpose: it catches a broken timer,
    # not a slow machine. Counting the waits as compute would read near 0; missing a
    # stage's compute, or the schedule serialising the stages, would read 0.5 or more.
    assert theory * 0.75 <= row["bubble_measured"] <= theory * 2, \
        (row, row["cpu_per_busy_second_per_rank"])
