"""``ddl layout``: which rank holds what, through the real CLI. The rank table follows the
layout's mixed radix, the groups and node crossings follow from it, the figures in
docs/layout.md are the command's current output, and bad input is one line, exit 2."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import REPO, assert_one_line_error, run_ddl

from ddl.contract.layout import DIMS, ParallelLayout

pytestmark = pytest.mark.unit

DOC = REPO / "docs" / "layout.md"
FIGURE = re.compile(r"```text\n\$ ddl (layout[^\n]*)\n(.*?)```", re.DOTALL)


def _layout(*args: str) -> str:
    proc = run_ddl("layout", *args, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def _section(out: str, title: str) -> dict[str, str]:
    """The ``  dim  text`` lines under a heading, by dimension."""
    body = out.split(title, 1)[1].split("\n\n", 1)[0]
    return {line.split()[0]: line.split(None, 1)[1] for line in body.strip("\n").splitlines()
            if not line.lstrip().startswith("note:") and line.startswith("  ")
            and not line.startswith("        ")}


def test_groups_partition_the_world_into_ranks_differing_in_one_coordinate():
    """ParallelLayout.groups, which the command prints (torch's DeviceMesh builds the same
    groups: tests/distributed/test_layout_groups.py)."""
    layout = ParallelLayout(pp=2, dp_replicate=2, dp_shard=3, tp=2)  # 24 ranks, all split
    for dim in DIMS:
        groups = layout.groups(dim)
        assert sorted(r for g in groups for r in g) == list(range(24))
        for group in groups:
            assert len(group) == getattr(layout, dim)
            places = [layout.coordinates(r) for r in group]
            assert [p[dim] for p in places] == list(range(len(group)))
            assert all({k: v for k, v in p.items() if k != dim} ==
                       {k: v for k, v in places[0].items() if k != dim} for p in places)
    assert layout.groups("dp_shard")[:2] == [[0, 2, 4], [1, 3, 5]]
    assert ParallelLayout(tp=4).groups("pp") == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="no dimension 'dp'"):
        layout.groups("dp")


def test_3d_mesh_on_two_nodes_places_each_rank_and_keeps_tp_inside_a_node():
    out = _layout("--mesh", "pp=2,tp=2,dp_shard=2", "--nproc", "4", "--nodes", "2")
    lines = out.splitlines()
    assert lines[0] == "pp=2 x dp_shard=2 x tp=2 on 2 nodes x 4 processes"
    assert lines[1] == "degrees: pp=2 dp_replicate=1 dp_shard=2 tp=2"
    head = lines.index("rank  node  local  pp  dp_replicate  dp_shard  tp")
    rows = [list(map(int, line.split())) for line in lines[head + 1:head + 9]]
    # rank, node, local, pp, dp_replicate, dp_shard, tp: tp fastest, pp outermost
    assert rows[5] == [5, 1, 1, 1, 0, 0, 1]
    assert [r[6] for r in rows] == [0, 1] * 4 and [r[3] for r in rows] == [0] * 4 + [1] * 4
    assert [r[1] for r in rows] == [0] * 4 + [1] * 4
    groups = _section(out, "groups (ranks that differ only in that coordinate):")
    assert groups == {"pp": "[0,4] [1,5] [2,6] [3,7]", "dp_shard": "[0,2] [1,3] [4,6] [5,7]",
                      "tp": "[0,1] [2,3] [4,5] [6,7]"}  # dp_replicate=1: not listed
    where = _section(out, "where each dimension's traffic runs:")
    assert where["pp"].startswith("crosses nodes")
    assert where["dp_shard"].startswith("inside a node")
    assert where["tp"].startswith("inside a node")
    assert "note:" not in out


def test_hsdp_on_two_nodes_shards_inside_and_replicates_across():
    out = _layout("--mesh", "dp_replicate=2,dp_shard=4", "--nodes", "2")  # 4 per node
    assert out.startswith("dp_replicate=2 x dp_shard=4 on 2 nodes x 4 processes\n")
    groups = _section(out, "groups (ranks that differ only in that coordinate):")
    assert groups == {"dp_replicate": "[0,4] [1,5] [2,6] [3,7]",
                      "dp_shard": "[0,1,2,3] [4,5,6,7]"}
    where = _section(out, "where each dimension's traffic runs:")
    assert where["dp_replicate"].startswith("crosses nodes")
    assert where["dp_shard"].startswith("inside a node")


def test_groups_that_cross_nodes_get_a_note():
    """tp=4 on nodes of 2: every tensor-parallel all-reduce would cross the network."""
    out = _layout("--mesh", "tp=4", "--nproc", "2", "--nodes", "4")
    where = _section(out, "where each dimension's traffic runs:")
    assert where["tp"].startswith("crosses nodes") and where["dp_shard"].startswith("crosses")
    assert "note: tp crosses nodes" in out and "note: dp_shard crosses nodes" in out
    mixed = _layout("--mesh", "tp=2", "--nproc", "3", "--nodes", "2")  # [2,3] spans both
    assert "1 of 3 groups crosses nodes" in mixed


def test_what_the_mesh_leaves_open_is_dp_shard():
    out = _layout("--mesh", "tp=2,dp=2", "--nproc", "4")
    assert out.startswith("dp_shard=2 x tp=2 on 1 node x 4 processes\n")
    assert _layout("--nproc", "3").startswith("dp_shard=3 on 1 node x 3 processes\n")


def test_the_figures_in_docs_layout_md_are_the_commands_output():
    figures = FIGURE.findall(DOC.read_text())
    assert len(figures) >= 2, "docs/layout.md lost its `$ ddl layout` figures"
    for command, shown in figures:
        fresh = _layout(*shlex.split(command)[1:])
        assert shown == fresh, f"docs/layout.md: rerun `ddl {command}` and paste:\n{fresh}"


@pytest.mark.parametrize("args, needles", [
    (["--mesh", "pp=2,foo=2"], ["--mesh", "'foo'", "allowed: dp, dp_replicate, dp_shard"]),
    (["--mesh", "tp=3", "--nproc", "4"], ["tp=3", "does not divide", "4 processes"]),
    (["--mesh", "pp=2,tp=2", "--nproc", "2"], ["pp=2", "does not divide", "allowed"]),
    (["--mesh", "tp=2", "--nodes", "3"], ["--nodes: 3", "allowed: a divisor of 2"]),
    (["--mesh", "dp=2,dp_shard=2"], ["dp is shorthand for dp_shard"]),
    (["--nodes", "0"], ["--nodes: 0", "allowed: a whole number >= 1"]),
    (["--nproc", "0"], ["--nproc: 0", "allowed"]),
    (["--mesh", "tp=0"], ["--mesh", "'tp=0'"]),
    (["--nproc", "four"], ["--nproc", "'four'"]),
])
def test_bad_input_is_one_line_and_exit_2(args, needles):
    proc = run_ddl("layout", *args, timeout=60)
    assert_one_line_error(proc, *needles)
    assert proc.stdout == ""
