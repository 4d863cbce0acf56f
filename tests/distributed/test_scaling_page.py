"""docs/scaling-study.md: its block, run as written, gives what the page shows (issue 24,
item 4) and reports no speed-up above 2.2 on 2 processes (issues 23 and 38).

Serial: a speed-up is a ratio of two runs' times, read with no other test on the CPU. The
page's numbers are one machine's on one day; what must hold anywhere is their shape: the
same table (columns, devices), throughputs of the same order (within 4x: another preset,
batch or step count would be 5-20x off), no speed-up reported above what 2 ranks can give
(a measured ratio above that is printed as invalid, with its cause: other work on a
shared machine can still slow the baseline's rounds).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.distributed, pytest.mark.serial]

PAGE = REPO / "docs" / "scaling-study.md"
MAX_SPEEDUP = 2.2  # 2 processes on this 2-core machine; the bar


def _block(marker: str, fence: str = "sh") -> str:
    match = re.search(rf"<!-- {marker} -->\n```{fence}\n(.*?)\n```", PAGE.read_text(), re.S)
    assert match, f"{PAGE.name}: no ```{fence} block below <!-- {marker} -->"
    return match.group(1)


def _table(text: str) -> tuple[str, dict[int, list[str]]]:
    """The header line (its two-word "epoch s" joined, so that its words line up with
    a row's cells) and the rows by device count of a printed scaling table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("devices "))
    header = lines[start].replace("epoch s", "epoch_s")
    rows = {}
    for line in lines[start + 1:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = cells
    return header, rows


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    where = tmp_path_factory.mktemp("scaling-page")
    ddl = where / "ddl"
    ddl.write_text(f'#!/bin/sh\nexec "{Path(sys.executable).with_name("ddl")}" "$@"\n')
    ddl.chmod(0o755)
    # as a reader runs it: ddl's thread rule decides every point's threads (no
    # OMP_NUM_THREADS, which the other tests set to 1)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(["bash", "-e", "-c", _block("scaling-study-block")], cwd=where,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return where, proc.stdout


def test_no_speedup_above_ideal(study):
    where, stdout = study
    points = json.loads((where / "runs" / "scale" / "scale.json").read_text())["points"]
    assert [p["devices"] for p in points] == [1, 2]
    for p in points:
        assert p["threads_per_rank"] == 1, p  # the same at every point
        if p["above_ideal"]:  # no result: shown as invalid, with its cause
            assert p["speedup"] is None and f"warning: {p['warning']}" in stdout, p
        else:
            assert p["speedup"] <= MAX_SPEEDUP, (p["devices"], p["speedup"])


def test_the_page_shows_the_table_the_block_prints(study):
    _, stdout = study
    shown_header, shown = _table(_block("scaling-study-output", "text"))
    printed_header, printed = _table(stdout)
    assert shown_header.split() == printed_header.split()
    assert sorted(shown) == sorted(printed) == [1, 2]
    columns = printed_header.split()
    rate, seconds = columns.index("samples/s"), columns.index("epoch_s")
    for devices, cells in shown.items():
        # samples in the measured epoch: 20 steps x 100 per replica x devices; the page's
        # epoch seconds have 2 decimals, so its product is good to ~2 %
        page = float(cells[rate]) * float(cells[seconds])
        now = float(printed[devices][rate]) * float(printed[devices][seconds])
        assert abs(page - now) <= 0.05 * now, (devices, page, now)
        assert abs(now - 2000 * devices) <= 0.05 * 2000 * devices, (devices, now)
    assert (REPO / "docs" / "img" / "scaling" / "speedup-2-cores.png").stat().st_size > 0


def test_a_batch_that_cannot_fit_is_refused_in_one_line(study):
    where, _ = study
    proc = subprocess.run(["bash", "-c", _block("scaling-study-refusal")], cwd=where,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ddl: error:")]
    shown = re.search(r"\n    (ddl: error: .*)\n", PAGE.read_text()).group(1)
    assert errors == [shown], proc.stderr
    assert "Traceback" not in proc.stderr
