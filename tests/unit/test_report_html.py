"""report.html (ddl.commands.report_html): self-contained (no remote references, every image
an embedded PNG), every value escaped, the warm-up epoch marked, one row per rank; for one
run (hand-written runs of known shape, and one real `ddl train`) and for a study.
tests/system/test_browser.py opens the same pages in a real Chromium."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import run_ddl
from report_runs import HOSTILE, write_run

pytestmark = pytest.mark.unit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """The parts of a page the tests look at: images, and table rows with their cells."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[dict] = []
        self.rows: list[tuple[dict, list[str]]] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        elif tag == "tr":
            self.rows.append((attrs, []))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1][1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def render(run_dirs: list[Path], out: Path) -> str:
    from ddl.commands import report

    written = report.write(report.build(run_dirs), out)
    assert written[-1] == out / "report.html"
    return written[-1].read_text(encoding="utf-8")


@pytest.fixture
def pipeline_page(tmp_path) -> str:
    run = write_run(tmp_path / "runs" / "pp<i>", ranks=4, pipeline=True,
                    command=["ddl", "train", "--run-dir", HOSTILE])
    return render([run], tmp_path / "out")


@pytest.fixture
def study_page(tmp_path) -> str:
    runs = [write_run(tmp_path / "study" / f"n{n}<b>", ranks=n) for n in (1, 2, 4)]
    return render([tmp_path / "study"], tmp_path / "out"), runs


def assert_self_contained(text: str) -> None:
    remote = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]*""", text,
                        re.IGNORECASE)
    assert not remote, remote
    assert not re.search(r"<\s*(script|link|iframe|object|embed)\b", text, re.IGNORECASE)
    assert "@import" not in text and "url(" not in text


def assert_images_are_embedded_pngs(page: Page, at_least: int) -> None:
    from PIL import Image

    assert len(page.images) >= at_least
    for img in page.images:
        head, _, data = img["src"].partition(",")
        assert head == "data:image/png;base64", head
        png = base64.b64decode(data, validate=True)
        assert png.startswith(PNG_SIGNATURE)
        Image.open(io.BytesIO(png)).verify()  # a whole PNG, not only its signature
        assert img.get("alt")


def rows_of(page: Page, **wanted: str) -> list[tuple[dict, list[str]]]:
    return [(a, cells) for a, cells in page.rows
            if all(a.get(k) == v for k, v in wanted.items())]


def test_run_page_is_self_contained_with_embedded_pngs(pipeline_page):
    assert_self_contained(pipeline_page)
    # loss, accuracy, throughput, data wait, utilisation, memory, bubble
    assert_images_are_embedded_pngs(Page(pipeline_page), at_least=7)


def test_values_from_results_json_are_escaped(pipeline_page):
    assert HOSTILE not in pipeline_page and "<script" not in pipeline_page.lower()
    assert "&lt;script&gt;alert(" in pipeline_page  # the command line, shown escaped
    assert "pp&lt;i&gt;" in pipeline_page and "pp<i>" not in pipeline_page  # the run dir


def test_warmup_epoch_is_marked(pipeline_page):
    page = Page(pipeline_page)
    warmup = rows_of(page, **{"class": "warmup"})
    measured = rows_of(page, **{"class": "measured"})
    assert [cells[:2] for _, cells in warmup] == [["1", "warm-up (excluded)"]]
    assert [cells[0] for _, cells in measured] == ["2", "3"]
    assert 'alt="throughput per epoch, warm-up marked"' in pipeline_page  # grey, hatched


def test_one_row_per_rank_with_utilisation_memory_and_bubble(pipeline_page):
    page = Page(pipeline_page)
    ranks = rows_of(page, **{"class": "rank"})
    assert [a["data-rank"] for a, _ in ranks] == ["0", "1", "2", "3"]
    head = next(cells for a, cells in page.rows if "rank" in cells and "pipeline bubble" in cells)
    for r, (_, cells) in enumerate(ranks):
        row = dict(zip(head, cells))
        assert row["CPU % mean"] == str(90 + r)
        assert row["peak RSS MB"] == f"{800 + 10 * r:.1f}"
        assert row["pipeline bubble"] == f"{0.3 + 0.05 * r:.1%}"


def test_configuration_table_shows_the_run(pipeline_page):
    config = {cells[0]: cells[1] for a, cells in Page(pipeline_page).rows if len(cells) == 2}
    assert config["strategy"].startswith("pp, ddl-strategies")
    assert config["mesh degrees"] == "pp=4, dp_replicate=1, dp_shard=1, tp=1"
    assert config["precision"] == "fp32"
    assert config["batch"].startswith("32 per replica, 128 global")
    assert "torch 2.14.1" in config["versions"]
    assert config["threads per rank"].startswith("1 (OMP_NUM_THREADS=1")


def test_study_page_has_the_scaling_table_plots_and_a_row_per_run(study_page):
    text, runs = study_page
    assert_self_contained(text)
    page = Page(text)
    assert_images_are_embedded_pngs(page, at_least=4)  # time, throughput, speedup, loss
    assert "<title>Scaling study: mnist (tiny) with ddp</title>" in text
    table = [cells for a, cells in page.rows if cells and cells[0] in ("1", "2", "4")]
    assert [c[0] for c in table] == ["1", "2", "4", "1", "2", "4"]  # scaling table, runs
    assert [c[3] for c in table[:3]] == ["1.00", "2.00", "4.00"]  # speedup
    for run, cells in zip(runs, table[3:]):
        assert cells[1] == str(run)  # the directory as text, not a link
    assert "<a " not in text and "n1&lt;b&gt;" in text


def test_missing_metrics_jsonl_falls_back_to_results_json(tmp_path):
    run = write_run(tmp_path / "r", ranks=1)
    (run / "metrics.jsonl").write_text("{not json\n")
    text = render([run], tmp_path / "out")
    assert "results.json (no readable metrics.jsonl)" in text
    assert len(rows_of(Page(text), **{"class": "measured"})) == 2


def test_a_real_run(synthetic_mnist, tmp_path):
    """`ddl train` then `ddl report RUN_DIR --output DIR`: the page of what the trainer
    really wrote (the shape the hand-written runs above copy)."""
    run = tmp_path / "run"
    train = run_ddl("train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "1",
                    "--epochs", "2", "--steps-per-epoch", "2", "--data-dir",
                    str(synthetic_mnist), "--run-dir", str(run), cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    proc = run_ddl("report", str(run), "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "out" / "report.html") in proc.stdout
    text = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert_self_contained(text)
    page = Page(text)
    assert_images_are_embedded_pngs(page, at_least=6)
    assert "Per-epoch numbers from metrics.jsonl" in text
    assert [cells[1] for _, cells in page.rows if _.get("class") in ("warmup", "measured")] \
        == ["warm-up (excluded)", "measured"]
    assert [a["data-rank"] for a, _ in rows_of(page, **{"class": "rank"})] == ["0"]
    assert "<title>mnist (tiny) with ddp on 1 cpu process(es)</title>" in text


def test_a_plugins_odd_metric_name_is_escaped_and_drawn_as_written(tmp_path):
    """Metric names come from the workload plugin: HTML in them is escaped, and a ``$``
    reaches matplotlib as text, not as (broken) mathtext."""
    run = write_run(tmp_path / "r", ranks=1, epochs=25)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    odd = [json.loads(line) for line in lines]
    for record in odd:
        record["val"]["<b>$\\bad{x}$"] = 0.5  # unparsable as mathtext
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in odd))
    text = render([run], tmp_path / "out")
    assert "<b>" not in text and "val &lt;b&gt;$\\bad{x}$" in text
    assert_images_are_embedded_pngs(Page(text), at_least=7)


# --- issue 52, item 12 ---------------------------------------------------------------------
def _edit_results(run: Path, **changes) -> Path:
    results = json.loads((run / "results.json").read_text())
    results.update(changes)
    (run / "results.json").write_text(json.dumps(results))
    return run


GPU_PEAK_ON_CPU = {"flops_per_sample": 1935360, "achieved_flops_per_device": 7.4e8,
                   "peak_flops_per_device": 191.5e12, "peak_source": "site profile lumi-g",
                   "mfu": 3.9e-6}


def test_a_cpu_run_under_a_gpu_site_has_no_mfu_and_says_why(tmp_path):
    """A `--device cpu` run with --site lumi: no MFU against the GCD's peak ('0.0 %' before),
    in the table, the page and scale.json's point, also for results written before."""
    from ddl.commands import report

    run = _edit_results(write_run(tmp_path / "r", ranks=1), site="lumi-g",
                        mfu=GPU_PEAK_ON_CPU)
    built = report.build([run])
    point = built["points"][0]
    assert point["mfu"] is None and point["peak_flops_per_device"] is None
    assert "cpu run" in point["mfu_note"] and "lumi-g" in point["mfu_note"]
    table = report.format_table(built)
    assert "0.00%" not in table and "note: MFU '-' for 1 device(s): none: a cpu run" in table
    text = render([run], tmp_path / "out")
    mfu_rows = {cells[0]: cells[1] for a, cells in Page(text).rows if len(cells) == 2}
    assert mfu_rows["MFU"] == "-" and "peak of its rocm devices" in text
    assert "No MFU: none: a cpu run" in text
    # --peak-flops of ddl report still gives one
    assert report.build([run], 1e9)["points"][0]["mfu"] is not None


def test_the_worker_records_no_gpu_peak_for_a_cpu_run():
    from ddl.worker import mfu

    peak, source = mfu.site_peak(191.5e12, "lumi-g", "rocm", "cpu")
    assert peak is None and source.startswith("none: a cpu run")
    assert mfu.site_peak(191.5e12, "lumi-g", "rocm", "cuda") == (191.5e12,
                                                                  "site profile lumi-g")
    assert mfu.site_peak(None, "local", "cpu", "cpu") == (None, "site profile local")


def test_the_page_shows_the_container_results_json_records(tmp_path):
    record = {"runtime": "apptainer", "image": "/p/project/x/ddl.sif", "target": "cpu",
              "commit": "13f294b", "built": "2026-11-29T07:00:00Z", "ddl_version": "0.1.0",
              "file": {"size": 1.5 * 2**30, "mtime": "2026-11-29T07:05:00+0000"}}
    run = _edit_results(write_run(tmp_path / "r", ranks=1), container=record)
    config = {cells[0]: cells[1] for a, cells in Page(render([run], tmp_path / "o")).rows
              if len(cells) == 2}
    assert config["container"].startswith("/p/project/x/ddl.sif (apptainer, target cpu)")
    assert "commit 13f294b" in config["container"] and "1.50 GiB" in config["container"]
    plain = write_run(tmp_path / "plain", ranks=1)
    config = {cells[0]: cells[1] for a, cells in Page(render([plain], tmp_path / "p")).rows
              if len(cells) == 2}
    assert config["container"] == "none (not run in a container)"


def test_a_single_run_gets_report_html_only(tmp_path):
    from ddl.commands import report

    run = write_run(tmp_path / "r", ranks=1)
    written = report.write(report.build([run]), run)
    assert written == [run / "report.html"]
    assert not list(run.glob("scale.*")) and not list(run.glob("*.png"))
    study = [write_run(tmp_path / "s" / f"n{n}", ranks=n) for n in (1, 2)]
    names = {p.name for p in report.write(report.build(study), tmp_path / "s")}
    assert {"scale.json", "scale.csv", "speedup.png", "report.html"} <= names


def test_the_legend_does_not_cover_the_data_wait_bars(monkeypatch):
    """The legend overlapped the measured bars of the data-wait figure (issue 52)."""
    from matplotlib.patches import Rectangle

    from ddl.commands import report_charts as charts
    from report_runs import epoch

    figures = []
    monkeypatch.setattr(charts, "_png", lambda fig: figures.append(fig) or b"")
    epochs = [epoch(n, 2) for n in range(1, 4)]
    for e in epochs:  # a data wait of 60-80 %: bars up to the top, no corner left free
        e["data_wait_s"] = e["time_s"] * (0.5 + 0.1 * e["epoch"])
    charts.data_wait(epochs)
    charts.throughput(epochs)
    charts.memory([{"model_state_bytes": 9e4, "peak_rss_bytes": (800 + r) * 2**20}
                   for r in range(4)])
    for fig in figures:
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent(renderer)
        bars = [p.get_window_extent(renderer) for p in ax.patches if isinstance(p, Rectangle)]
        assert bars and not any(legend.overlaps(b) for b in bars), ax.get_title()
        charts.pyplot().close(fig)
