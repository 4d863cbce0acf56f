"""One mesh, passed in (issue 40): no module outside the mesh's owner works out a rank's
place in the layout by arithmetic. The worker builds the DeviceMesh once
(ddl/worker/process/mesh.py) from the layout, whose own methods define the rank order
(ddl/contract/layout.py); `ddl layout` prints that order for people
(ddl/commands/layout.py). Everything else asks the mesh, so a change of rank order in
one place cannot leave a loader, sync-BN or the pipeline on another. `ddl plan`'s modules
predict candidate layouts (no live rank) and use the layout's arithmetic as it is."""

import ast
import re

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

SOURCES = [*(REPO / "packages").glob("*/src/**/*.py"),
           *(REPO / "packages").glob("plugins/*/src/**/*.py")]
OWNERS = {"ddl/worker/process/mesh.py", "ddl/contract/layout.py", "ddl/commands/layout.py"}
# `ddl plan` reasons about layouts that are not running (each rank of a candidate, which
# groups cross a node; `--verify`: which stage a finished run's rank N was in): the
# layout's arithmetic is its subject, no live rank is derived
PLANNERS = {"ddl/planning/planner.py", "ddl/planning/plan_probe.py",
            "ddl/planning/layout_search.py", "ddl/planning/pipeline_schedule.py",
            "ddl/commands/plan_verify.py"}
# a place in the layout from a rank: the layout's rank arithmetic, or a rank divided or
# taken modulo by a count (how a data-parallel rank used to be derived)
LAYOUT_CALLS = {"dp_rank", "coordinates", "device_mesh"}
RANK_ARITHMETIC = re.compile(r"\brank\s*(%|//)")


def _owner(path) -> str:
    parts = path.parts
    return "/".join(parts[parts.index("src") + 1:])


def rank_arithmetic(source: str) -> list[str]:
    """What in ``source`` works a rank's place out itself: calls of the layout's rank
    methods, and ``rank % n`` / ``rank // n``."""
    found = [f"line {node.lineno}: .{node.func.attr}()"
             for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in LAYOUT_CALLS]
    found += [f"line {i}: {line.strip()}" for i, line in enumerate(source.splitlines(), 1)
              if RANK_ARITHMETIC.search(line.split("#")[0])]
    return found


def test_only_the_mesh_owner_derives_ranks():
    offenders = {}
    for path in SOURCES:
        name = _owner(path)
        if name in OWNERS | PLANNERS:
            continue
        found = rank_arithmetic(path.read_text())  # device_mesh: the mesh built again
        if found:
            offenders[name] = found
    assert not offenders, offenders


@pytest.mark.parametrize("planted", [
    "replica = world.rank % stride\n",
    "dp = layout.dp_rank(world.rank)\n",
    "stage = run.layout.coordinates(rank)['pp']\n",
])
def test_planted_arithmetic_is_found(planted):
    assert rank_arithmetic(planted)
