"""The parallel layout: degrees from --mesh by one rule, ranks placed pipeline-outermost and
tensor-parallel innermost, every mistake one line naming the degree."""

import pytest

from ddl.contract.errors import UsageError
from ddl.contract.layout import ParallelLayout, resolve
from ddl.contract.plugins import Plugins

pytestmark = pytest.mark.unit


def _strategy(name):
    spec = Plugins().strategy(name)
    return spec.create({})


def test_coordinates_put_tp_innermost_and_pp_outermost():
    layout = ParallelLayout(pp=2, dp_shard=2, tp=2)
    assert layout.world_size == 8 and layout.dp == 2
    assert layout.coordinates(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "tp": 1}
    assert [layout.coordinates(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [layout.coordinates(r)["pp"] for r in range(8)] == [0] * 4 + [1] * 4
    # the ranks of one tensor-parallel group train on the same share of the batch
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    hsdp = ParallelLayout(dp_replicate=2, dp_shard=2)
    assert [hsdp.dp_rank(r) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        layout.coordinates(8)


def test_describe_names_only_the_split_dimensions():
    assert ParallelLayout(pp=2, dp_shard=2, tp=2).describe() == "pp=2 x dp_shard=2 x tp=2"
    assert ParallelLayout().describe() == "1 process"


@pytest.mark.parametrize("strategy, mesh, world, expected", [
    ("ddp", {}, 4, {"dp_replicate": 4}),
    ("fsdp", {}, 4, {"dp_shard": 4}),
    ("tp", {}, 4, {"tp": 4}),
    ("fsdp+tp", {}, 4, {"dp_shard": 2, "tp": 2}),          # tp=2 unless given
    ("fsdp+tp", {"dp": 4}, 4, {"dp_shard": 4, "tp": 1}),   # a given dp leaves the rest to tp
    ("fsdp+tp", {"tp": 4}, 8, {"dp_shard": 2, "tp": 4}),
    ("fsdp+tp", {"dp_shard": 2, "tp": 2}, 4, {"dp_shard": 2, "tp": 2}),
    ("pp", {}, 4, {"pp": 4}),                               # one pipeline over every rank
    ("pp", {"dp": 2}, 4, {"pp": 2, "dp_replicate": 2}),
    ("pp", {"pp": 2}, 8, {"pp": 2, "dp_replicate": 4}),     # a given pp leaves the rest to dp
])
def test_each_strategy_resolves_its_mesh_by_the_one_rule(strategy, mesh, world, expected):
    layout = _strategy(strategy).resolve_layout(mesh, world)
    assert layout == ParallelLayout(**expected)
    assert layout.world_size == world


@pytest.mark.parametrize("strategy, mesh, world, needles", [
    ("ddp", {"dp": 2}, 2, ["--mesh: ddp has no dimension 'dp'", "allowed: none"]),
    ("fsdp+tp", {"pp": 2}, 4, ["fsdp+tp has no dimension 'pp'", "allowed: dp, dp_shard, tp"]),
    ("fsdp+tp", {"tp": 3}, 4, ["tp=3 does not divide the world of 4", "divides 4"]),
    ("fsdp+tp", {"dp": 2, "tp": 4}, 4, ["dp_shard=2 x tp=4 = 8 processes", "world has 4"]),
    ("fsdp+tp", {"dp": 2, "dp_shard": 2}, 4, ["dp is shorthand for dp_shard"]),
    ("pp", {"dp": 3}, 4, ["dp_replicate=3 does not divide the world of 4"]),
])
def test_a_layout_that_does_not_fit_is_one_line(strategy, mesh, world, needles):
    with pytest.raises(UsageError) as caught:
        _strategy(strategy).resolve_layout(mesh, world)
    message = str(caught.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_minimum_degree_is_named():
    with pytest.raises(UsageError, match="needs pp >= 2"):
        resolve({"dp_replicate": 2}, 2, strategy="x", allowed=frozenset({"dp_replicate", "pp"}),
                dp_means="dp_replicate", fill=("pp",), minimum={"pp": 2})
