"""The pipeline bubble ddl reports matches (p-1)/(v*m+p-1) on a balanced split.

Runs benchmarks/pp_bubble.py small: 2 real processes over gloo, ddl's pipeline strategy with
its schedules, p2p hand-offs and compute timers, on a chain of equal blocks. The reported
idle fraction is a ratio of two times measured in the same run.

The bubble is checked against theory with ``--compute accelerator``: each layer holds the
host for a fixed time, as a host waits for its GPU, so the split is balanced by construction
and the CPU is mostly free for the hand-offs (40 ms per layer forward: measured 1-5 % above
theory on one quiet VM, 17-23 % on another; the bar here is 40 %, the issue's 10 % is for a
GPU node, where benchmarks/pp_bubble.py runs in the GPU kit). This stands in for a GPU node
(none here); the schedule, the communication and the timers are the real ones. With real
matmuls on this 2-core VM (``--compute matmul``) op times vary by 10-20 % and each hand-off
waits for the OS scheduler, so that run is held to a wide bar (0.75-2x theory) that still
catches a broken timer; benchmarks/pp_bubble.py --compute matmul records the CPU numbers.

All four runs go side by side (``runs`` below), their timed steps started together.
"""

import json
import os
import sys
import time
from multiprocessing.connection import wait

import pytest

import rankpool
from conftest import REPO

# serial: the bubble is a ratio of times, read with no other test on the CPU
pytestmark = [pytest.mark.distributed, pytest.mark.serial]


# Steps per run. The first is not measured (it builds buffers, and the runs wait for each
# other after it), so each bubble is that of one step: 3-5 % above theory for the
# accelerator runs, 0.24 for the matmul run; with 3 steps 2-5 % and 0.25 (2026-11-29, all
# four side by side on an otherwise quiet machine: 18.0 s wall, 20.3 s with 3 steps).
STEPS = 2


def _benchmark(argv: list[str], log: str) -> None:
    """``benchmarks/pp_bubble.py ARGV`` (its main), output to ``log``, in a fork of this
    session's fork server (tests/rankpool.py), which has torch and ddl imported: with four
    fresh interpreters importing them the fixture took 19.3 s, forked 12.3 s (2026-11-29,
    the serial phase on an otherwise quiet machine)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.path.insert(0, str(REPO / "benchmarks"))
    import pp_bubble

    sys.exit(pp_bubble.main(["--steps", str(STEPS), *argv]))


# (schedule, m, v). Side by side, the run with the longest step decides the fixture's time;
# a step is v*m + 1 stage-times of 0.48 s (4 layers of 40 ms forward, 80 ms backward), here
# 1.4-2.4 s. Until 2026-11-29 they were GPipe m=4, 1F1B m=8, interleaved m=4 (2.4, 4.3 and
# 4.3 s a step): 31.6 -> 25.0 s wall for the three (3 steps each, load average 4-5 from
# other work; 1-6 % above theory either way). Two bubble sizes (1/3, 1/5) still tell a
# timer that follows the schedule from one that reads the same whatever it is.
ACCELERATOR_RUNS = [("gpipe", 2, 1), ("1f1b", 4, 1), ("interleaved1f1b", 2, 2)]


MATMUL = "matmul gpipe"  # the CPU-compute run's key among the side-by-side runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three accelerator-compute runs and the matmul run side by side, their timed steps
    started together (--start-together). Each accelerator run holds the host in sleeps, so
    they share the two cores without waiting for them: the three alone read 1.0-3.2 % above
    theory in 3 runs, one after the other 1-5 %, and 22 s side by side where they took 53 s
    one after the other (with the longer runs before 2026-11-29, see ACCELERATOR_RUNS).
    The matmul run computes on both cores meanwhile, and a sleeping stage that wakes for a
    hand-off waits little for a core: with it beside them the three read 2-5 % above theory
    (1-5 % without it) and the matmul run 0.24-0.25 (0.24-0.25 alone), in 2 runs of each
    (2026-11-29, quiet machine); its 6 s alone after the three became ~3 s more of theirs.
    A run that fails stops the others."""
    where = tmp_path_factory.mktemp("bubble")
    commands = {schedule: ["--compute", "accelerator", "--schedules", schedule,
                           "--microbatches", str(microbatches)]
                for schedule, microbatches, _ in ACCELERATOR_RUNS}
    commands[MATMUL] = ["--compute", "matmul", "--schedules", "gpipe", "--microbatches", "4"]
    context = rankpool.context()
    procs = {}
    for i, (name, args) in enumerate(commands.items()):
        argv = [*args, "--start-together", f"{where}:{len(commands)}",
                "--out", str(where / f"run-{i}.json")]
        procs[name] = context.Process(target=_benchmark, name=f"pp_bubble {name}",
                                      args=(argv, str(where / f"run-{i}.log")))
        procs[name].start()
    deadline = time.monotonic() + 600
    running = dict(procs)
    try:
        while running:
            ended = wait([p.sentinel for p in running.values()],
                         timeout=max(0.0, deadline - time.monotonic()))
            assert ended, f"still running after 600 s: {sorted(running)}"
            for name in [n for n, p in running.items() if p.sentinel in ended]:
                proc = running.pop(name)
                proc.join()
                log = where / f"run-{list(procs).index(name)}.log"
                assert proc.exitcode == 0, f"{name} (exit {proc.exitcode}):\n{log.read_text()}"
    finally:
        for proc in running.values():
            proc.kill()
            proc.join(30)
    return {name: json.loads((where / f"run-{i}.json").read_text())["runs"][0]
            for i, name in enumerate(procs)}


@pytest.mark.parametrize("schedule, microbatches, v", ACCELERATOR_RUNS)
def test_bubble_near_theory_on_a_balanced_split(runs, schedule, microbatches, v):
    row = runs[schedule]
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


def test_bubble_with_cpu_matmuls_is_near_theory(runs):
    row = runs[MATMUL]
    assert (row["schedule"], row["stages_per_rank"], row["microbatches"]) == ("gpipe", 1, 4)
    theory = 0.2
    # Quiet runs read 0.22-0.25, a loaded CI machine 0.27 (hand-offs wait for the OS
    # scheduler, op times vary), so this bar is wide on purpose: it catches a broken timer,
    # not a slow machine. Counting the waits as compute would read near 0; missing a
    # stage's compute, or the schedule serialising the stages, would read 0.5 or more.
    assert theory * 0.75 <= row["bubble_measured"] <= theory * 2, \
        (row, row["cpu_per_busy_second_per_rank"])
