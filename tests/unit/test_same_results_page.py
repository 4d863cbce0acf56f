"""docs/same-results.md: its tables are what scripts/same_results.py prints for the runs its
block makes, and the page's claim (one process with two threads drifts as far as the
layouts after 128 steps) holds for the numbers shown."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

PAGE = (REPO / "docs" / "same-results.md").read_text()


def _tables(text: str) -> list[list[list[str]]]:
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows and not line.startswith("|---"):
            tables.append(rows[1:])  # without the header
            rows = []
    return tables


def test_tables_list_the_runs_the_block_makes_and_the_first_is_the_reference():
    block = PAGE.split("<!-- measured-by-this-block -->", 1)[1].split("```")[1]
    runs = re.findall(r'"(\d) (\d) (\w+)"', block)
    expected = [f"same-{p}x{t}-{s}" for p, t, s in runs]
    tables = _tables(PAGE)
    assert len(tables) == 2, tables
    for table in tables:
        assert [row[0] for row in table] == expected
        assert [row[1] for row in table] == [f"{p} x {t}" for p, t, _ in runs]
        assert float(table[0][4]) == 0 and float(table[0][6]) == 0


def test_the_claim_holds_for_the_numbers_shown():
    after_128 = {row[0]: float(row[4]) for row in _tables(PAGE)[1]}
    threads = after_128.pop("same-1x2-ddp")
    assert min(after_128.values()) == 0  # the reference
    layouts = [d for name, d in after_128.items() if name != "same-1x1-ddp"]
    assert threads >= min(layouts), (threads, layouts)  # as far as the layouts drift


def test_script_prints_the_distances_from_results_files(tmp_path):
    def run(name, world, threads, train, test):
        d = tmp_path / name
        d.mkdir()
        (d / "results.json").write_text(json.dumps({
            "world": {"size": world}, "threads": {"per_rank": threads}, "strategy": "ddp",
            "epochs": [{"train": {"loss": 9.0}}, {"train": {"loss": train}}],
            "final": {"test": {"loss": test}}}))
        return str(d)

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "same_results.py"),
                           run("a", 1, 1, 2.0, 4.0), run("b", 2, 1, 2.002, 3.96)],
                          capture_output=True, text=True, check=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| a") or
            line.startswith("| b")]
    assert rows[1].split("|")[5].strip() == "1.00e-03"  # |2.002 - 2| / 2, last epoch
    assert rows[1].split("|")[7].strip() == "1.00e-02"  # |3.96 - 4| / 4
    assert rows[1].split("|")[2].strip() == "2 x 1"
