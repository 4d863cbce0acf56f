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
                f"{row['ddl_over_accelerate']:.3f}",
                f"{row['median_data_wait_share'] * 100:.1f} %"]
        assert _row(page, workload)[:6] == want, workload


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
