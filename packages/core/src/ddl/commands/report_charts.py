"""The figures of report.html (ddl.commands.report_html), drawn with matplotlib as PNG bytes.

Each function takes the numbers from results.json / metrics.jsonl and returns the PNG, or
None when the run has nothing to draw (no metric of that name, no pipeline). matplotlib is
imported on the first drawing only (``pyplot``), with the Agg backend: files only, no
display on compute nodes.
"""

from __future__ import annotations

import io
import math
from typing import Any

from ddl.contract.errors import DdlError

WARMUP_COLOUR, MEASURED_COLOUR = "#b0b0b0", "#1f77b4"
MB = 2**20


def pyplot():
    """matplotlib.pyplot on the Agg backend, or one line saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise DdlError("the plots need matplotlib, which is not installed: "
                       "pip install 'ddl[plots]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def number(value: Any) -> float | None:
    """A finite number from the JSON, or None (missing, null, NaN, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    pyplot().close(fig)
    return buffer.getvalue()


def _figure(ylabel: str, title: str, xlabel: str = "epoch"):
    """A figure whose labels are shown as written (a ``$`` from a plugin's metric name is no
    mathtext)."""
    fig, ax = pyplot().subplots(figsize=(5, 3.2))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel.replace("$", r"\$"))
    ax.set_title(title.replace("$", r"\$"), fontsize=9)
    return fig, ax


def _epoch_ticks(ax, epochs: list[dict[str, Any]]) -> None:
    """Every epoch on the axis when there are few, whole numbers only otherwise."""
    if len(epochs) <= 20:
        ax.set_xticks([e["epoch"] for e in epochs])
    else:
        ax.xaxis.get_major_locator().set_params(integer=True)


def _percent(ax) -> None:
    from matplotlib.ticker import PercentFormatter

    ax.yaxis.set_major_formatter(PercentFormatter(1.0))


def _legend_below(ax) -> None:
    """The legend under the axes, never over the data: inside, matplotlib's "best" place
    still covered the data-wait bars (a warm-up bar low, measured bars high, no corner
    free)."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2,
              frameon=False)


def metric_names(epochs: list[dict[str, Any]]) -> list[str]:
    """The metrics of the train and val splits, loss first, in the order first seen."""
    names: dict[str, None] = {}
    for e in epochs:
        for split in ("train", "val"):
            for name, value in (e.get(split) or {}).items():
                if number(value) is not None:
                    names[name] = None
    return sorted(names, key=lambda n: n != "loss")


def metric_curve(epochs: list[dict[str, Any]], name: str) -> bytes | None:
    """One metric per epoch, train and val; the warm-up epoch shaded."""
    fig, ax = _figure(name, f"{name} per epoch")
    drawn = False
    for split, style in (("train", "o-"), ("val", "s--")):
        points = [(e["epoch"], number((e.get(split) or {}).get(name))) for e in epochs]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            drawn = True
            ax.plot(*zip(*points), style, label=split, markersize=4)
    if not drawn:
        pyplot().close(fig)
        return None
    for k, e in enumerate(e for e in epochs if e.get("warmup")):
        ax.axvspan(e["epoch"] - 0.5, e["epoch"] + 0.5, color=WARMUP_COLOUR, alpha=0.3,
                   label=None if k else "warm-up")
    _epoch_ticks(ax, epochs)
    ax.legend(fontsize=8)
    return _png(fig)


def _epoch_bars(epochs: list[dict[str, Any]], values: list[float | None], ylabel: str,
                title: str, percent: bool = False) -> bytes:
    """A bar per epoch, the warm-up epoch grey and labelled as excluded."""
    fig, ax = _figure(ylabel, title)
    for warmup, colour, label in ((True, WARMUP_COLOUR, "warm-up (excluded from the summary)"),
                                  (False, MEASURED_COLOUR, "measured")):
        bars = [(e["epoch"], v) for e, v in zip(epochs, values)
                if bool(e.get("warmup")) is warmup and v is not None]
        if bars:
            ax.bar(*zip(*bars), color=colour, label=label,
                   hatch="//" if warmup else None, edgecolor="white")
    _epoch_ticks(ax, epochs)
    if percent:
        _percent(ax)
    _legend_below(ax)
    return _png(fig)


def throughput(epochs: list[dict[str, Any]]) -> bytes:
    return _epoch_bars(epochs, [number(e.get("samples_per_s")) for e in epochs],
                       "samples/s (global)", "throughput per epoch")


def data_wait(epochs: list[dict[str, Any]]) -> bytes:
    shares = []
    for e in epochs:
        wait, seconds = number(e.get("data_wait_s")), number(e.get("time_s"))
        shares.append(wait / seconds if wait is not None and seconds else None)
    return _epoch_bars(epochs, shares, "share of the epoch", "time waiting for data",
                       percent=True)


def _rank_bars(series: list[tuple[str, list[float | None]]], ylabel: str,
               title: str) -> bytes | None:
    """Grouped bars, one group per rank, one bar per named series."""
    series = [(name, values) for name, values in series
              if any(v is not None for v in values)]
    if not series:
        return None
    fig, ax = _figure(ylabel, title, xlabel="rank")
    ranks = max(len(values) for _, values in series)
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        bars = [(r + (k - (len(series) - 1) / 2) * width, v)
                for r, v in enumerate(values) if v is not None]
        ax.bar(*zip(*bars), width=width, label=name)
    ax.set_xticks(range(ranks))
    _legend_below(ax)
    return _png(fig)


def memory(per_rank: list[dict[str, Any]]) -> bytes | None:
    def megabytes(key: str) -> list[float | None]:
        return [(v / MB if (v := number(m.get(key))) is not None else None) for m in per_rank]

    return _rank_bars([("model state", megabytes("model_state_bytes")),
                       ("peak RSS", megabytes("peak_rss_bytes")),
                       ("device peak", megabytes("device_peak_allocated_bytes"))],
                      "MB", "memory per rank")


def utilisation(per_rank: list[dict[str, Any]]) -> bytes | None:
    return _rank_bars([("CPU % (mean)", [number(u.get("cpu_percent_mean")) for u in per_rank]),
                       ("GPU % (mean)", [number(u.get("device_util_percent_mean"))
                                         for u in per_rank])],
                      "% (CPU: 100 = one core)", "utilisation per rank")


def bubble(report: dict[str, Any]) -> bytes | None:
    """The pipeline bubble measured on each rank, with the schedule's theory as a line."""
    per_rank = [number(v) for v in report.get("bubble_measured_per_rank") or []]
    bars = [(r, v) for r, v in enumerate(per_rank) if v is not None]
    if not bars:
        return None
    fig, ax = _figure("idle share of a step", f"pipeline bubble ({report.get('schedule')})",
                      xlabel="rank")
    ax.bar(*zip(*bars), label="measured")
    if (theory := number(report.get("bubble_theory"))) is not None:
        ax.axhline(theory, linestyle="--", color="grey", label=f"theory {theory:.1%}")
    ax.set_xticks(range(len(per_rank)))
    _percent(ax)
    ax.legend(fontsize=8)
    return _png(fig)


def loss_by_run(runs: list[tuple[str, list[dict[str, Any]]]]) -> bytes | None:
    """A study's validation loss per epoch, one line per run (the same training should
    converge alike at any scale)."""
    fig, ax = _figure("val loss", "validation loss per epoch, by run")
    drawn = False
    for label, epochs in runs:
        points = [(e["epoch"], number((e.get("val") or {}).get("loss"))) for e in epochs]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            drawn = True
            ax.plot(*zip(*points), "o-", label=label)
    if not drawn:
        pyplot().close(fig)
        return None
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    return _png(fig)
