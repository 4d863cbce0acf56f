"""The docs' "Measured here" tables that come from a benchmark say what its committed JSON
says (issue 24, item 5): rerunning a benchmark and forgetting the page, or editing a number
by hand, fails here. Pages whose numbers come from a runnable block are checked by running
the block (test_docs_commands.py, test_scaling_page.py, test_same_results_page.py)."""

import json
import re

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

RESULTS = REPO / "benchmarks" / "results"


def _page(name: str) -> str:
    return " ".join((REPO / "docs" / name).read_text().split())


def _row(page: str, first_cell: str) -> list[str]:
    match = re.search(rf"\| {re.escape(first_cell)} \|(.*?)\| (?=\||$)", page)
    assert match, f"no table row starting {first_cell!r}"
    return [c.strip() for c in match.group(0).strip("| ").split("|")][1:]


def test_overhead_table_is_the_committed_benchmark():
    result = json.loads((RESULTS / "overhead.json").read_text())
    page = _page("measuring.md")
    assert result["machine"]["date"] in page
    for workload, row in result["workloads"].items():
        t = row["median_step_time_s"]
        want = [f"{t['ddl'] * 1e3:.1f} ms", f"{t['plain'] * 1e3:.1f} ms",
                f"{t['accelerate'] * 1e3:.1f} ms", f"{row['ddl_over_plain']:.3f}",
                f"{row['ddl_over_plain_cpu']:.3f}", f"{row['ddl_over_accelerate']:.3f}",
                f"{row['median_data_wait_share'] * 100:.1f} %"]
        assert _row(page, workload)[:7] == want, workload


def test_instruction_table_is_the_committed_benchmark():
    result = json.loads((RESULTS / "overhead_instructions.json").read_text())
    page = _page("measuring.md")
    assert result["machine"]["date"] in page
    for workload, row in result["workloads"].items():
        main, every = row["ddl_over_plain_main"], row["ddl_over_plain_all"]
        want = [f"{row['ddl']['main']['Ir'] / 1e6:.2f} M",
                f"{row['plain']['main']['Ir'] / 1e6:.2f} M", f"{main['Ir']:.3f}",
                f"{every['Ir']:.3f}"] + [f"{main[e]:.3f}" if e in main else "-"
                                          for e in ("D1mr", "DLmr")]  # --cache-sim only
        assert _row(page, f"{workload} (instructions)")[:6] == want, workload


def test_activation_memory_table_is_the_committed_benchmark():
    memory = json.loads((RESULTS / "block_options.json").read_text())["activation_memory"]
    page = _page("training-at-scale.md")
    for workload, row in memory.items():
        saved = row["saved_for_backward_bytes"]
        cells = _row(page, next(c for c in (f"{workload} (t5-base, 512 tokens)",
                                            f"{workload} (xresnet50, course images)")
                                if f"| {c} |" in page))
        want = [f"{saved[k] / 1e6:.1f} MB" for k in ("none", "full", "selective")]
        want += [f"{row['full_over_none']:.3f}".rstrip("0"), f"{row['selective_over_none']:.2f}"]
        assert cells[:3] == want[:3], workload
        assert float(cells[3]) == pytest.approx(row["full_over_none"], abs=5e-4)
        assert float(cells[4]) == pytest.approx(row["selective_over_none"], abs=5e-3)


def test_pipeline_bubble_numbers_are_the_committed_benchmark():
    runs = json.loads((RESULTS / "pp_bubble-accelerator.json").read_text())["runs"]
    page = _page("strategies.md")
    claims = re.findall(r"(0\.\d{3}) for (0\.\d{3})", page)
    assert len(claims) >= 4
    measured = {(f"{r['bubble_measured']:.3f}", f"{r['bubble_theory']:.3f}") for r in runs}
    assert set(claims) <= measured, set(claims) - measured


# --- the MNIST pipeline bubble: one committed record, quoted everywhere (issue 43) ----------
BUBBLE_RECORD = RESULTS / "pp_bubble-mnist-tiny.json"
NUMBER = re.compile(r"(?<![\d.])0\.\d{2,3}(?!\d)")


def _bubble_record() -> dict:
    return json.loads(BUBBLE_RECORD.read_text())


def _allowed_bubbles(record: dict) -> set[str]:
    """What a page may quote in a sentence about the MNIST bubble: each run's per-rank
    reading, their ranges, the theory, and the accelerator benchmark drawn beside them."""
    per_rank = [run["strategy_report"]["bubble_measured_per_rank"] for run in record["runs"]]
    allowed = {f"{v:.2f}" for ranks in per_rank for v in ranks}
    allowed |= {f"{f(ranks[r] for ranks in per_rank):.2f}" for r in range(2) for f in (min, max)}
    allowed |= {"0.2", "0.20", "0.200"}
    for run in json.loads((RESULTS / "pp_bubble-accelerator.json").read_text())["runs"]:
        for v in (run["bubble_measured"], run["bubble_theory"]):
            allowed |= {f"{v:.2f}", f"{v:.3f}"}
    return allowed


def mnist_bubble_problems(text: str, record: dict) -> list[str]:
    """Numbers in a sentence about the MNIST bubble (a paragraph on the bubble or idle time,
    a sentence naming MNIST or the record) that the record does not hold."""
    allowed = _allowed_bubbles(record)
    wrong = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        if not re.search(r"bubble|idle", flat, re.I):
            continue
        for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z`(\[])", flat):
            if "MNIST" in sentence or BUBBLE_RECORD.name in sentence or "Rank 0 read" in sentence:
                wrong += [f"{n} in {sentence[:90]!r}" for n in NUMBER.findall(sentence)
                          if n not in allowed]
    return wrong


def test_every_mnist_bubble_quoted_is_the_committed_record():
    record = _bubble_record()
    for page in sorted((REPO / "docs").rglob("*.md")):
        assert not mnist_bubble_problems(page.read_text(), record), page


def test_the_bubble_check_fails_on_another_number():
    record = _bubble_record()
    page = (REPO / "docs" / "strategies.md").read_text()
    assert not mnist_bubble_problems(page, record)
    stale = page.replace("MNIST tiny, 2 stages, 4 microbatches (GPipe),",
                         "MNIST tiny, 2 stages, 4 microbatches (GPipe, e.g. 0.86),")
    assert stale != page
    problems = mnist_bubble_problems(stale, record)
    assert len(problems) == 1 and problems[0].startswith("0.86 in "), problems


def test_tutorial_and_strategies_quote_the_records_runs():
    record = _bubble_record()
    runs = record["runs"]
    per_rank = [run["strategy_report"]["bubble_measured_per_rank"] for run in runs]
    low_high = [f"{min(r[i] for r in per_rank):.2f}-{max(r[i] for r in per_rank):.2f}"
                for i in range(2)]
    tutorial, strategies = _page("tutorial.md"), _page("strategies.md")
    first = " and ".join(f"{v:.2f}" for v in per_rank[0])
    assert f"MNIST tiny run (3 epochs, {first}:" in tutorial  # the figure's run
    assert f"the figure's run: {runs[0]['step_s'] * 1e3:.1f} ms per step" in tutorial
    assert f"Rank 0 read {low_high[0]}, rank 1 {low_high[1]}" in tutorial
    assert f"read {low_high[0]} on the first stage and {low_high[1]} on the second" in strategies
    words = {6: "six"}
    assert f"{words[len(runs)]} runs" in tutorial and f"{words[len(runs)]} runs" in strategies
    # the conditions the tutorial states: load averages of the quiet and the loaded runs
    for hogs, label in ((0, "back to back at load average"), (2, "beside them, load")):
        loads = [v for run in runs if run["cpu_hogs_beside"] == hogs
                 for v in (run["load_avg_1min_before"], run["load_avg_1min_after"])]
        assert f"{label} {min(loads):.1f}-{max(loads):.1f}" in tutorial, (label, loads)


# --- the tutorial's 3-D step: its batch sentence is what ddl plans for its command ---------
def planned_3d_batch(step: str) -> str:
    """The batch sentence ddl's own plan gives for the step's `./ddl train` command (parser,
    config, preset, layout), as the tutorial words it."""
    import shlex

    from ddl.commands.flags import train_flags
    from ddl.commands.parser import make_parser
    from ddl.contract.layout import ParallelLayout
    from ddl.contract.plugins import Plugins
    from ddl.settings import config as cfg
    from ddl.settings.batch import resolve_batch

    command = next(line for line in step.splitlines() if line.startswith("./ddl train"))
    plugins = Plugins()
    config = cfg.build(train_flags(make_parser().parse_args(shlex.split(command)[1:])), {},
                       plugins).config
    _, preset = cfg.resolve_preset(config, plugins.workload(config.plugin))
    layout = ParallelLayout(**config.mesh)
    assert layout.world_size == config.nproc
    batch = resolve_batch(config, preset.batch_size, layout.dp)
    microbatches = config.microbatches or 2 * layout.pp  # compose.py: 2 x stages by default
    return (f"so the global batch of {batch.global_} is {batch.per_replica} per replica "
            f"(the preset's {preset.batch_size} per replica, as in step 7), cut into "
            f"{microbatches} microbatches of {batch.micro // microbatches}")


def test_tutorial_3d_batch_sentence_is_what_ddl_plans():
    """Step 8 is not a marked block (8 processes take long on 2 cores): its batch sentence
    is checked against ddl's plan for the command the page shows. A changed command (here
    a fixed global batch of 16, what the page once said without the flag) changes it."""
    step = (REPO / "docs" / "tutorial.md").read_text().split("## 8. 3-D")[1].split("\n## ")[0]
    said = planned_3d_batch(step)
    assert said in " ".join(step.split()), said
    fixed = step.replace("--nproc 8 ", "--nproc 8 --global-batch-size 16 ")
    assert fixed != step and planned_3d_batch(fixed).startswith(
        "so the global batch of 16 is 8 per replica")
