"""What ``ddl plugins`` prints: workloads, strategies and which strategy supports which
workload, in columns as wide as the longest name (third-party plugins bring long ones).

Works on the light specs only, so listing never imports torch.
"""

from __future__ import annotations

from ddl.contract.plugins import Plugins


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
    for spec in strategies.values():
        lines.append(f"  {spec.name:<{width}} {spec.summary}; "
                     f"from {_origin(plugins, spec.plugin)}")
    if workloads and strategies:
        lines += _support_table(workloads, strategies, width)
    for info in plugins.broken:
        lines.append(f"BROKEN plugin {info.name!r} ({info.source}): {info.error}")
    return [line.rstrip() for line in lines]


def _support_table(workloads, strategies, width: int) -> list[str]:
    names = list(strategies)
    cell_widths = [max(len(n), len("yes")) for n in names]

    def row(first: str, cells: list[str]) -> str:
        return f"  {first:<{width}} " + " ".join(
            f"{c:<{w}}" for c, w in zip(cells, cell_widths))

    lines = ["Support (workload x strategy):", row("", names)]
    for wl in sorted(workloads.values(), key=lambda spec: spec.name):
        lines.append(row(wl.name, ["yes" if strategies[n].supports(wl) else "-"
                                   for n in names]))
    return lines


def _origin(plugins: Plugins, plugin: str) -> str:
    return plugins.version_of(plugin) or plugin
