"""`ddl plugins`: the columns follow the longest name, so third-party plugins with long
names still read as tables."""

from types import SimpleNamespace

import pytest

from ddl.contract.hookspecs import hookimpl
from ddl.commands.plugin_listing import render
from ddl.contract.plugins import Plugins
from ddl.contract.specs import Preset, StrategySpec, WorkloadSpec

pytestmark = pytest.mark.unit

LONG_WORKLOAD = "a-very-long-third-party-workload"
LONG_STRATEGY = "an-even-longer-third-party-strategy"


def _plugins(workloads: list[str], strategies: list[str]) -> Plugins:
    """Real registrations through the plugin manager, without the installed entry points."""
    preset = Preset("p", "a preset", epochs=1, batch_size=1, lr=0.1)

    @hookimpl
    def ddl_register_workloads():
        return [WorkloadSpec(n, f"about {n}", "nowhere:Nothing", {"p": preset}, "p",
                             capabilities=frozenset({"tp_plan"} if n == "mnist" else ()))
                for n in workloads]

    @hookimpl
    def ddl_register_strategies():
        return [StrategySpec(n, f"about {n}", "nowhere:Nothing",
                             requires=frozenset({"tp_plan"} if n == "tp" else ()))
                for n in strategies]

    plugins = Plugins(load_entry_points=False)
    plugins.register(SimpleNamespace(ddl_register_workloads=ddl_register_workloads,
                                     ddl_register_strategies=ddl_register_strategies),
                     "third-party")
    return plugins


def _section(lines: list[str], title: str) -> list[str]:
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("  ")),
               len(lines))
    return lines[start:end]


def _columns(line: str) -> list[int]:
    """Where each whitespace-separated word of a row starts."""
    return [i for i, ch in enumerate(line) if ch != " " and (i == 0 or line[i - 1] == " ")]


@pytest.mark.parametrize("workloads, strategies", [
    (["mnist", LONG_WORKLOAD], ["ddp", "tp"]),
    (["mnist", "xsum"], ["ddp", LONG_STRATEGY, "tp"]),
    (["mnist", LONG_WORKLOAD], ["ddp", LONG_STRATEGY]),
])
def test_columns_line_up_with_long_names(workloads, strategies):
    lines = render(_plugins(workloads, strategies))
    # the summaries start in one column, after the longest name and one space
    width = max(map(len, workloads + strategies))
    for title, names in (("Workloads (--plugin):", workloads),
                         ("Strategies (--strategy):", strategies)):
        rows = _section(lines, title)
        summaries = [r for r in rows if not r.lstrip().startswith("presets:")]
        assert [r.split()[0] for r in summaries] == names
        assert {r.index("about ") for r in summaries} == {3 + width}
        assert all(r.index("presets:") == 3 + width for r in rows if "presets:" in r)
    header, *rows = _section(lines, "Support (workload x strategy):")
    assert header.split() == strategies
    assert len(rows) == len(workloads)
    for row in rows:  # each cell under its strategy's name
        assert _columns(row) == [2] + _columns(header)
    assert not any(line != line.rstrip() for line in lines)


def test_support_cells_say_which_strategy_fits():
    lines = render(_plugins(["mnist", LONG_WORKLOAD], ["ddp", "tp"]))
    _, *rows = _section(lines, "Support (workload x strategy):")
    cells = {row.split()[0]: row.split()[1:] for row in rows}
    assert cells == {"mnist": ["yes", "yes"], LONG_WORKLOAD: ["yes", "-"]}
