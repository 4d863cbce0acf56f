"""What ``ddl plugins`` prints: workloads, strategies and which strategy supports which
workload, in columns as wide as the longest name (third-party plugins bring long ones);
then one line per plugin written for another contract version or using deprecated names.

Works on the light specs only, so listing never imports torch.
"""

from __future__ import annotations

from ddl.contract.plugins import Plugins
from ddl.contract.version import parse_range


def render(plugins: Plugins) -> list[str]:
    workloads, strategies = plugins.workloads(), plugins.strategies()
    # one first column for all three tables, so they read as one listing
    width = max(map(len, [*workloads, *strategies]), default=0)
    lines = ["Workloads (--plugin):"]
    for spec in workloads.values():
        presets = ", ".join(p + (" (default)" if p == spec.default_preset else "")
                            for p in spec.presets)
        lines.append(f"  {spec.name:<{width}} {spec.summary}")
        lines.append(f"  {'':<{width}} presets: {presets}; from {_origin(plugins, spec.plugin)}")
    lines.append("Strategies (--strategy):")
    unavailable = {name: spec.unavailable() for name, spec in strategies.items()}
    for spec in strategies.values():
        why = f" ({unavailable[spec.name]})" if unavailable[spec.name] else ""
        lines.append(f"  {spec.name:<{width}} {spec.summary}; "
                     f"from {_origin(plugins, spec.plugin)}{why}")
    if workloads and strategies:
        lines += _support_table(workloads, strategies, width, unavailable)
    lines += _contract_notes(plugins, [*workloads.values(), *strategies.values()])
    for info in plugins.broken:
        lines.append(f"BROKEN plugin {info.name!r} ({info.source}): {info.error}")
    return [line.rstrip() for line in lines]


def _contract_notes(plugins: Plugins, specs: list) -> list[str]:
    """One line per plugin written for another contract version (its specs' ``contract``)
    and per plugin that imports deprecated names; such plugins are listed, not refused."""
    lines = []
    declared = {(spec.plugin, spec.contract) for spec in specs if spec.contract}
    for plugin, contract in sorted(declared):
        problem = parse_range(contract).problem()
        if problem:
            lines.append(f"CONTRACT plugin {plugin!r} ({_origin(plugins, plugin)}) {problem}; "
                         "it may fail to load or train with this ddl")
    for info in plugins.infos:
        if info.deprecated:
            more = len(info.deprecated) - 1
            lines.append(f"DEPRECATED plugin {info.name!r} ({_origin(plugins, info.name)}): "
                         f"{info.deprecated[0]}" + (f" (and {more} more)" if more else ""))
    return lines


def _support_table(workloads, strategies, width: int, unavailable: dict) -> list[str]:
    """``yes`` where the strategy supports the workload; ``n/a`` for every workload where
    the strategy is unavailable here (a dependency missing)."""
    names = list(strategies)
    cell_widths = [max(len(n), len("yes")) for n in names]

    def row(first: str, cells: list[str]) -> str:
        return f"  {first:<{width}} " + " ".join(
            f"{c:<{w}}" for c, w in zip(cells, cell_widths))

    lines = ["Support (workload x strategy):", row("", names)]
    for wl in sorted(workloads.values(), key=lambda spec: spec.name):
        lines.append(row(wl.name, ["n/a" if unavailable[n] else
                                   "yes" if strategies[n].supports(wl) else "-"
                                   for n in names]))
    return lines


def _origin(plugins: Plugins, plugin: str) -> str:
    return plugins.version_of(plugin) or plugin
