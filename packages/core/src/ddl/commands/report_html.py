"""``report.html``: one page for a finished run or a scaling study, written by ``ddl report``
(and ``ddl scale``) beside scale.json.

Self-contained, so it can be copied off a cluster and opened offline: the figures are PNGs
drawn with matplotlib (ddl.commands.report_charts) embedded as ``data:`` URIs, the style is
inline, and there are no scripts, fonts, stylesheets or links to fetch. Every value read
from results.json passes through ``html.escape`` (it holds the user's command line). Plain
f-strings, not a template engine: Jinja2 is no dependency of ddl.

One run: key numbers, a curve per metric (train, val), throughput and data-wait share per
epoch with the warm-up epoch marked, the per-epoch table, one row per rank (utilisation,
memory, the pipeline bubble where the strategy reports one), MFU and the configuration.
Several runs: the scaling table and plots of scale.json, the validation loss of every run,
and a summary row per run (run directories as text: nothing links outside the file).
"""

from __future__ import annotations

import base64
import json
import shlex
from html import escape
from pathlib import Path
from typing import Any

from ddl.commands import report_charts as charts

NAME = "report.html"
MB = 2**20
STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em;
       color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em;
       border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right;
         vertical-align: top; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
tr.warmup td { background: #efefef; color: #666; } tr.above-ideal td { background: #fde8e8; }
code { white-space: pre-wrap; overflow-wrap: anywhere; }
.figures { display: flex; flex-wrap: wrap; gap: 0.8em; }
.figures img { max-width: 100%; border: 1px solid #eee; }
.note { color: #555; font-size: 0.9em; }
"""


def write(report: dict[str, Any], out: Path, pngs: list[Path]) -> Path:
    """report.html in ``out``: a run's page for a one-point report, else the study's (with
    the scaling plots ``pngs`` embedded)."""
    from ddl.commands.run_results import read_results

    runs = [(p, read_results(Path(p["run_dir"]))) for p in report["points"]]
    if len(runs) == 1:
        title, body = run_page(*runs[0])
    else:
        title, body = study_page(report, runs, pngs)
    path = out / NAME
    path.write_text(page(title, body), encoding="utf-8")
    return path


# --- HTML pieces: every value goes through text() or cell() ---------------------------------

def text(value: Any) -> str:
    return "-" if value is None or value == "" else escape(str(value))


def num(value: Any, spec: str = ".4g") -> str:
    """A number in ``spec``, anything else as escaped text."""
    n = charts.number(value)
    return text(value) if n is None else escape(format(n, spec))


def percent(value: Any) -> str:
    return num(value, ".1%")


def megabytes(value: Any) -> str:
    n = charts.number(value)
    return "-" if n is None else f"{n / MB:.1f}"


def table(head: list[str] | None, rows: list[list[str]], *, left: tuple[int, ...] = (),
          attrs: list[str] | None = None, id_: str = "") -> str:
    """Cells are HTML already (made with text/num); the columns in ``left`` are text
    (aligned left, numbers right); no header row for ``head=None``."""
    def row(cells: list[str], tag: str) -> str:
        return "".join(f'<{tag}{" class=text" if k in left else ""}>{c}</{tag}>'
                       for k, c in enumerate(cells))

    body = "".join(f"<tr{a}>{row(r, 'td')}</tr>\n"
                   for r, a in zip(rows, attrs or [""] * len(rows)))
    ident = f' id="{id_}"' if id_ else ""
    thead = f"<thead><tr>{row(head, 'th')}</tr></thead>\n" if head else ""
    return f"<table{ident}>{thead}<tbody>{body}</tbody></table>"


def pairs(rows: list[tuple[str, str]], id_: str = "") -> str:
    """A two-column table: label, value (HTML)."""
    return table(None, [[escape(k), v] for k, v in rows], left=(0, 1), id_=id_)


def image(png: bytes | None, alt: str) -> str:
    if png is None:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def figures(*imgs: str) -> str:
    return f'<div class="figures">{"".join(imgs)}</div>'


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n"
            f"<body><h1>{escape(title)}</h1>\n{body}\n"
            f'<p class="note">Written by ddl report. Self-contained: it fetches nothing and '
            f"can be opened offline.</p></body></html>\n")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return [v if isinstance(v, dict) else {} for v in value] if isinstance(value, list) else []


def _flat(mapping: Any, sep: str = " ") -> str:
    """``{"a": 1, "b": 2}`` as ``a 1, b 2`` (escaped)."""
    return text(", ".join(f"{k}{sep}{v}" for k, v in _dict(mapping).items()) or None)


def _metrics(mapping: Any) -> str:
    return text(", ".join(f"{k} {charts.number(v):.4g}" if charts.number(v) is not None
                          else f"{k} {v}" for k, v in _dict(mapping).items()) or None)


def command_line(results: dict[str, Any]) -> str:
    command = results.get("command")
    if isinstance(command, list):
        return f"<code>{escape(shlex.join(map(str, command)))}</code>"
    return f"<code>{text(command)}</code>"


# --- one run -----------------------------------------------------------------------------

def epochs_of(run_dir: Path, results: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The per-epoch records and where they came from: metrics.jsonl (the last record of
    an epoch wins), else results.json's ``epochs``."""
    by_epoch: dict[int, dict[str, Any]] = {}
    try:
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else None
            if isinstance(record, dict) and isinstance(record.get("epoch"), int):
                by_epoch[record["epoch"]] = record
        source = "metrics.jsonl"
    except (OSError, ValueError):
        by_epoch, source = {}, ""
    if not by_epoch:
        by_epoch = {e["epoch"]: e for e in _list(results.get("epochs"))
                    if isinstance(e.get("epoch"), int)}
        source = "results.json (no readable metrics.jsonl)"
    return [by_epoch[k] for k in sorted(by_epoch)], source


def run_page(point: dict[str, Any], results: dict[str, Any]) -> tuple[str, str]:
    run_dir = Path(point["run_dir"])
    epochs, source = epochs_of(run_dir, results)
    world = _dict(results.get("world"))
    title = (f"{point['plugin']} ({point['preset']}) with {point['strategy']} on "
             f"{point['devices']} {world.get('device', '')} process(es)")
    parts = [(f'<p>Run directory {text(run_dir)}; site {text(point["site"])}; '
             f'{text(results.get("started_at"))} to {text(results.get("finished_at"))}.</p>'),
             "<h2>Key numbers</h2>", pairs(key_numbers(point, results), "summary"),
             "<h2>Curves per epoch</h2>", figures(*curves(epochs)),
             (f'<p class="note">Per-epoch numbers from {text(source)}. The first epoch is '
             "warm-up (start-up, first batches, allocator) and excluded from the summary.</p>"),
             epoch_table(epochs), "<h2>Per rank</h2>", rank_section(results),
             "<h2>MFU</h2>", mfu_section(point, results)]
    strategy = _dict(results.get("strategy_report"))
    if strategy:
        parts += ["<h2>Strategy report</h2>",
                  figures(image(charts.bubble(strategy), "pipeline bubble per rank")),
                  pairs([(k, _metrics(v) if isinstance(v, dict) else text(v))
                         for k, v in strategy.items()], "strategy")]
    parts += ["<h2>Configuration</h2>", pairs(configuration(results), "configuration")]
    profile = [p.get("summary") for p in _list(results.get("profile")) if p.get("summary")]
    if profile:
        parts += ["<h2>Profile</h2>", "".join(f"<p><code>{text(s)}</code></p>"
                                             for s in profile)]
    return title, "\n".join(parts)


def key_numbers(point: dict[str, Any], results: dict[str, Any]) -> list[tuple[str, str]]:
    final = _dict(results.get("final"))
    measured = ", ".join(map(str, point["epochs_measured"]))
    return [("epoch time (s)", (f"{num(point['epoch_time_s'])} (mean of epoch(s) "
                               f"{text(measured)})")),
            ("samples/s (global)", num(point["samples_per_s"])),
            ("data-wait share", percent(point["data_wait_fraction"])),
            ("MFU", percent(point["mfu"])),
            ("final val", _metrics(final.get("val"))),
            ("test", _metrics(final.get("test"))),
            ("parameters", num(results.get("parameters"), ",.0f")),
            ("wall time (s)", num(results.get("wall_time_s"), ".1f"))]


def curves(epochs: list[dict[str, Any]]) -> list[str]:
    imgs = [image(charts.metric_curve(epochs, n), f"{n} per epoch")
            for n in charts.metric_names(epochs)]
    return imgs + [image(charts.throughput(epochs), "throughput per epoch, warm-up marked"),
                   image(charts.data_wait(epochs), "data-wait share per epoch")]


def epoch_table(epochs: list[dict[str, Any]]) -> str:
    names = charts.metric_names(epochs)
    head = ["epoch", "phase", "time s", "samples", "samples/s", "data wait s", "data wait",
            "lr", *(f"train {text(n)}" for n in names), *(f"val {text(n)}" for n in names)]
    rows, attrs = [], []
    for e in epochs:
        warmup = bool(e.get("warmup"))
        wait, seconds = charts.number(e.get("data_wait_s")), charts.number(e.get("time_s"))
        rows.append([num(e["epoch"]), "warm-up (excluded)" if warmup else "measured",
                     num(seconds), num(e.get("samples")), num(e.get("samples_per_s"), ".1f"),
                     num(wait), percent(wait / seconds if wait is not None and seconds else None),
                     num(e.get("lr")),
                     *(num(_dict(e.get("train")).get(n)) for n in names),
                     *(num(_dict(e.get("val")).get(n)) for n in names)])
        attrs.append(' class="warmup"' if warmup else ' class="measured"')
    return table(head, rows, attrs=attrs, id_="epochs")


def rank_section(results: dict[str, Any]) -> str:
    usage, memory = _list(results.get("utilisation")), _list(results.get("memory_per_rank"))
    bubble = _dict(results.get("strategy_report")).get("bubble_measured_per_rank")
    bubble = bubble if isinstance(bubble, list) else []
    size = charts.number(_dict(results.get("world")).get("size")) or 0
    ranks = max(int(size), len(usage), len(memory), len(bubble))
    by_rank = {u.get("rank", r): u for r, u in enumerate(usage)}
    head = ["rank", "CPU % mean", "CPU % max", "GPU % mean", "GPU % max", "params MB",
            "grads MB", "optimizer MB", "model state MB", "peak RSS MB", "device peak MB"]
    rows, attrs = [], []
    for r in range(ranks):
        u, m = by_rank.get(r, {}), memory[r] if r < len(memory) else {}
        rows.append([str(r), num(u.get("cpu_percent_mean"), ".0f"),
                     num(u.get("cpu_percent_max"), ".0f"),
                     num(u.get("device_util_percent_mean"), ".0f"),
                     num(u.get("device_util_percent_max"), ".0f"),
                     *(megabytes(m.get(k)) for k in (
                         "params_bytes", "grads_bytes", "optimizer_bytes", "model_state_bytes",
                         "peak_rss_bytes", "device_peak_allocated_bytes"))]
                    + ([percent(bubble[r] if r < len(bubble) else None)] if bubble else []))
        attrs.append(f' class="rank" data-rank="{r}"')
    head += ["pipeline bubble"] if bubble else []
    sources = sorted({f"CPU: {u.get('cpu_source')}; GPU: {u.get('device_source')}"
                      for u in usage})
    return "\n".join([
        figures(image(charts.utilisation(usage), "utilisation per rank"),
                image(charts.memory(memory), "memory per rank")),
        table(head, rows, attrs=attrs, id_="ranks"),
        *(f'<p class="note">Utilisation sampled once a second ({text(s)}).</p>'
          for s in sources)])


def mfu_section(point: dict[str, Any], results: dict[str, Any]) -> str:
    block = _dict(results.get("mfu"))
    peak, why_none = point.get("peak_flops_per_device"), point.get("mfu_note")
    source = why_none or (block.get("peak_source") if peak == block.get("peak_flops_per_device")
                          else "--peak-flops of ddl report")
    rows = [("flops per sample", num(block.get("flops_per_sample"), ",.0f")),
            ("achieved FLOP/s per device", num(block.get("achieved_flops_per_device"), ".4g")),
            ("peak FLOP/s per device", f"{num(peak, '.4g')} ({text(source)})"),
            ("MFU", percent(point.get("mfu")))]
    why = f"No MFU: {text(why_none)}. " if why_none else "No device peak: "
    note = ("" if peak else f'<p class="note">{why}Give ddl report --peak-flops '
            "(a number, or 'measure' on this CPU) for an MFU.</p>")
    return pairs(rows, "mfu") + note


def configuration(results: dict[str, Any]) -> list[tuple[str, str]]:
    world, batch, lr = (_dict(results.get(k)) for k in ("world", "batch", "lr"))
    threads, data = _dict(results.get("threads")), _dict(results.get("data"))
    versions = dict(_dict(results.get("versions")))
    plugins = _dict(versions.pop("plugins", None))
    synthetic = " (synthetic)" if data.get("synthetic") else ""
    return [
        ("command", command_line(results)),
        ("plugin (preset)", (f"{text(results.get('plugin'))} ({text(results.get('preset'))}), "
                            f"{text(plugins.get('workload'))}")),
        ("strategy", f"{text(results.get('strategy'))}, {text(plugins.get('strategy'))}"),
        ("site", text(results.get("site"))),
        ("world", (f"{text(world.get('size'))} process(es), {text(world.get('device'))}, "
                  f"{text(world.get('backend'))}, data-parallel size "
                  f"{text(world.get('dp_size'))}")),
        ("mesh degrees", _flat(world.get("parallel"), "=")),
        ("precision", text(results.get("precision"))),
        ("batch", (f"{text(batch.get('per_replica'))} per replica, {text(batch.get('global'))} "
                  f"global, micro {text(batch.get('micro'))}, "
                  f"{text(batch.get('accumulation_steps'))} accumulation step(s)")),
        ("learning rate", _flat(lr)),
        ("threads per rank", (f"{text(threads.get('per_rank'))} "
                             f"({text(threads.get('source'))})")),
        ("loader workers", text(results.get("loader_workers"))),
        ("steps per epoch", text(results.get("steps_per_epoch"))),
        ("activation checkpointing", text(results.get("activation_checkpointing"))),
        ("compile", _flat(results.get("compile"))),
        ("data", text(data.get("dir")) + synthetic),
        ("container", container(results.get("container"))),
        ("versions", _flat(versions)),
        ("restarts", _flat(results.get("restarts"))),
        ("resumed from", _flat(_dict(results.get("checkpoints")).get("resumed_from"))),
    ]


def container(record: Any) -> str:
    """results.json's ``container``: the image a run ran in, with its build labels."""
    if not isinstance(record, dict):
        return "none (not run in a container)"
    file = _dict(record.get("file"))
    size = charts.number(file.get("size"))
    where = (f"; image file {size / 2**30:.2f} GiB, modified {text(file.get('mtime'))}"
             if size is not None else "; image file not visible inside")
    return (f"{text(record.get('image'))} ({text(record.get('runtime'))}, target "
            f"{text(record.get('target'))}); built from ddl commit {text(record.get('commit'))} "
            f"on {text(record.get('built'))}, ddl {text(record.get('ddl_version'))}{where}")


# --- a study -----------------------------------------------------------------------------

def study_page(report: dict[str, Any], runs: list[tuple[dict[str, Any], dict[str, Any]]],
               pngs: list[Path]) -> tuple[str, str]:
    from ddl.commands.run_results import SCALING_WORDS

    title = (f"Scaling study: {report['plugin']} ({report['preset']}) with "
             f"{report['strategy']}")
    head = ["devices", "epoch s", "samples/s", "speedup", "efficiency", "spread", "rounds",
            "MFU", "data wait", "max RSS MB", "CPU %", "GPU %"]
    rows = [[num(p["devices"]), num(p["epoch_time_s"], ".3f"), num(p["samples_per_s"], ".1f"),
             "invalid !" if p.get("above_ideal") else num(p["speedup"], ".2f"),
             percent(p["efficiency"]), num(p.get("spread"), ".0%"), num(p.get("rounds", 1)),
             percent(p["mfu"]), percent(p["data_wait_fraction"]),
             megabytes(p["max_peak_rss_bytes"]), num(p["cpu_percent_mean"], ".0f"),
             num(p["device_util_percent_mean"], ".0f")] for p, _ in runs]
    attrs = [' class="above-ideal"' if p.get("above_ideal") else "" for p, _ in runs]
    warnings = "".join(f"<li>{text(p['warning'])}</li>" for p, _ in runs if p.get("warning"))
    losses = charts.loss_by_run([(f"{p['devices']} device(s)", epochs_of(Path(p["run_dir"]),
                                                                          r)[0])
                                 for p, r in runs])
    parts = [(f"<p>{text(SCALING_WORDS[report['scaling']])}; speedup and efficiency against "
             f"{text(report['baseline_devices'])} device(s), from samples/s (the median over "
             "a point's rounds; spread = (max - min) / median); epoch time without the "
             "warm-up epoch. A speedup more than 10 % above ideal is no result (invalid, "
             "see the warnings).</p>"),
             table(head, rows, attrs=attrs, id_="scaling"),
             f'<ul class="warnings">{warnings}</ul>' if warnings else "",
             figures(*(image(p.read_bytes(), p.stem) for p in pngs),
                     image(losses, "validation loss per epoch, by run")),
             "<h2>Runs</h2>", table(
                 ["devices", "run directory", "mesh degrees", "precision", "batch per replica",
                  "global batch", "lr", "threads per rank", "epochs", "final val", "test",
                  "wall time s", "versions", "container"],
                 [run_row(p, r) for p, r in runs], left=(1, 2, 3, 9, 10, 12, 13),
                 id_="runs")]
    return title, "\n".join(parts)


def run_row(point: dict[str, Any], results: dict[str, Any]) -> list[str]:
    final, versions = _dict(results.get("final")), _dict(results.get("versions"))
    return [num(point["devices"]), text(point["run_dir"]),
            _flat(_dict(results.get("world")).get("parallel"), "="),
            text(results.get("precision")),
            num(point["batch_per_replica"]), num(point["batch_global"]),
            num(_dict(results.get("lr")).get("scaled")), text(point.get("threads_per_rank")),
            num(len(_list(results.get("epochs")))), _metrics(final.get("val")),
            _metrics(final.get("test")), num(results.get("wall_time_s"), ".1f"),
            text(f"ddl {versions.get('ddl')}, torch {versions.get('torch')}"),
            text(_dict(results.get("container")).get("image"))]
