"""The thread policy (ddl.settings.cores.decide_threads): one rule for every launcher."""

import pytest

from ddl.settings.cores import GIVEN, capture_user_setting
from ddl.settings.cores import decide_threads as decide

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("launcher, ranks, bound, affinity, env, want", [
    # local processes share the machine evenly
    ("local", 1, False, 2, {}, 2),
    ("local", 2, False, 2, {}, 1),
    ("local", 4, False, 2, {}, 1),  # never 0
    ("local", 4, False, 16, {}, 4),
    # the user's OMP_NUM_THREADS wins, also when a launcher set its own after capturing it
    ("local", 2, False, 16, {"OMP_NUM_THREADS": "3"}, 3),
    ("local", 2, False, 16, {GIVEN: "5", "OMP_NUM_THREADS": "1"}, 5),
    ("local", 2, False, 16, {GIVEN: "", "OMP_NUM_THREADS": "1"}, 8),  # 1 was the launcher's
    # Slurm: an srun task is one rank; a torchrun task shares its cores among local ranks
    ("srun", 4, False, 128, {"SLURM_CPUS_PER_TASK": "12"}, 12),
    ("torchrun", 4, False, 128, {"SLURM_CPUS_PER_TASK": "48"}, 12),
    ("torchrun_jsc", 4, False, 128, {"SLURM_CPUS_PER_TASK": "48"}, 12),
    ("srun", 4, False, 128, {}, 32),  # no cpus-per-task: the node's cores per task
    # cores bound to this rank (LUMI's GCD -> cores map): all of them
    ("torchrun", 8, True, 7, {"SLURM_CPUS_PER_TASK": "56"}, 7),
])
def test_threads_per_rank(launcher, ranks, bound, affinity, env, want):
    chosen = decide(launcher=launcher, local_ranks=ranks, bound=bound, affinity=affinity,
                    env=env)
    assert chosen.per_rank == want, chosen


def test_the_source_says_why():
    assert decide(launcher="local", local_ranks=2, bound=False, affinity=2,
                  env={}).source == "2 usable cores / 2 local ranks"
    assert "set by the user" in decide(launcher="local", local_ranks=2, bound=False,
                                       affinity=2, env={"OMP_NUM_THREADS": "2"}).source


def test_launchers_capture_the_users_value_once():
    env = {"OMP_NUM_THREADS": "6"}
    capture_user_setting(env)
    env["OMP_NUM_THREADS"] = "1"  # what the launcher sets for its workers' start-up
    capture_user_setting(env)  # a second launcher layer keeps the first capture
    assert env[GIVEN] == "6"
    unset: dict[str, str] = {}
    capture_user_setting(unset)
    assert unset[GIVEN] == ""
