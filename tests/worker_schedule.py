"""How `./run-tests` hands the parallel phase's tests to its pytest-xdist workers.

pytest-xdist's `worksteal` (it splits the tests evenly, then an idle worker takes the back
half of the longest queue left) with one change: a test module whose module fixture is
costly (KEEP_TOGETHER) is never split between workers, so that fixture is built once.
Everything else may be split anywhere.

Why: the default `load` hands the last tests out in large chunks, and on 2 workers one of
them ran the last ~100 s of distributed tests alone while the other sat idle (measured
2026-11-27: workers ended at 454 and 567 s). Plain `worksteal` split the 3-D module and built
its 8-rank run on every worker (2026-11-26: 20:18 against 19:04 for `load`).
"""

from __future__ import annotations

from xdist.scheduler import WorkStealingScheduling
from xdist.scheduler.worksteal import MIN_PENDING, NodePending

# Modules whose module-scoped fixture costs more than a few of their tests: CPU seconds of
# the fixture, measured alone on an idle machine (DDL_TEST_CPU_REPORT, cpu_machine), 2026-11-27.
KEEP_TOGETHER = {
    "tests/distributed/test_layout_3d.py": 31.5,  # the 8-rank 3-D run through the CLI
    "tests/distributed/test_reliability.py": 8.8,  # a checkpointed run to resume from
    "tests/distributed/test_accumulation.py": 6.4,  # the single-process references
}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def kept_together(nodeid: str) -> bool:
    return module_of(nodeid) in KEEP_TOGETHER


def may_cut(nodeids: list[str], queue: list[int], at: int) -> bool:
    """May ``queue`` (indices into ``nodeids``) be cut before position ``at``?"""
    if at <= 0 or at >= len(queue):
        return True
    before, after = nodeids[queue[at - 1]], nodeids[queue[at]]
    return module_of(before) != module_of(after) or not kept_together(after)


def nearest_cut(nodeids: list[str], queue: list[int], want: int, lowest: int) -> int | None:
    """The allowed cut of ``queue`` nearest ``want`` and not below ``lowest`` (later cuts
    first on a tie); None when there is none."""
    allowed = [at for at in range(lowest, len(queue)) if may_cut(nodeids, queue, at)]
    return min(allowed, key=lambda at: (abs(at - want), -at)) if allowed else None


class ModuleKeepingWorkStealing(WorkStealingScheduling):
    """`worksteal` whose hand-outs and steals never split a KEEP_TOGETHER module."""

    def _send_tests(self, node, num: int) -> None:
        if 0 < num < len(self.pending):
            num = nearest_cut(self.collection, self.pending, num, 1) or len(self.pending)
        super()._send_tests(node, num)

    def check_schedule(self) -> None:
        """worksteal's check_schedule, with the steal cut where nearest_cut allows (xdist
        computes its cut inside this method, so the method is repeated here whole)."""
        nodes_up = [NodePending(node, pending) for node, pending in self.node2pending.items()
                    if not node.shutting_down]

        def idle_nodes() -> list:
            return [node for node, pending in nodes_up if len(pending) < MIN_PENDING]

        if not idle_nodes():
            return
        if self.pending:
            idle = idle_nodes()
            for i, node in enumerate(idle):
                self._send_tests(node, len(self.pending) // (len(idle) - i))
            if not idle_nodes():
                return
        if self.steal_requested_from_node is not None:  # one steal at a time
            return
        for victim in sorted(nodes_up, key=lambda n: len(n.pending), reverse=True):
            queue = victim.pending  # [running, next, waiting...]: keep at least the first two
            keep = nearest_cut(self.collection, queue, len(queue) - len(queue) // 2,
                               MIN_PENDING)
            if keep is not None and keep < len(queue):
                victim.node.send_steal(queue[keep:])
                self.steal_requested_from_node = victim.node
                return
        for node in idle_nodes():  # nothing left to take: let them finish
            node.shutdown()
