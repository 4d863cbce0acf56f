"""The commands the docs mark runnable on a CPU run as written and succeed.

A page marks a fenced shell block with the comment `<!-- runnable-on-cpu -->` on the line
before it (Markdown keeps the comment; the rendered page hides it). Blocks run in page
order, each block as one `bash -e` script, in a fresh directory where `./ddl` is this venv's
ddl (the repository's `./ddl` wrapper would create or check .venv first; the tests already
run inside it), relayed to the pytest process's fork server as any test's `ddl` command
runs (tests/cli_relay.py: no fresh interpreter importing torch per command). Several ranks
train over gloo, hence the distributed marker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import cli_relay
from conftest import REPO

pytestmark = pytest.mark.distributed

# Pages whose marked blocks run here. A sequential page's blocks build on each other and run
# in one test; a step page's blocks need only its first (the data) and each is a test.
SEQUENTIAL_PAGES = ["docs/getting-started.md"]
STEP_PAGES = ["docs/tutorial.md"]
MARKER = "<!-- runnable-on-cpu -->"
BLOCK = re.compile(re.escape(MARKER) + r"\n```(?:sh|bash|console)\n(.*?)\n```", re.S)


def runnable_blocks(text: str) -> list[str]:
    blocks = BLOCK.findall(text)
    assert len(blocks) == text.count(MARKER) - text.count(f"`{MARKER}`"), \
        f"a {MARKER} comment is not directly above a ```sh block"
    return blocks


def test_marker_extraction():
    page = f"intro `{MARKER}`\n{MARKER}\n```sh\na\nb\n```\n\n```sh\nnot marked\n```\n"
    assert runnable_blocks(page) == ["a\nb"]
    with pytest.raises(AssertionError, match="not directly above"):
        runnable_blocks(f"{MARKER}\n\n```sh\nx\n```\n")


def test_relayed_ddl_answers_as_the_console_script(tmp_path):
    """The blocks' `./ddl` (tests/cli_relay.py) gives a script what the console script gives:
    stdout, stderr, exit code and a redirection (commands that import no torch: the
    comparison runs each twice)."""
    cli_relay.write_ddl(tmp_path)
    script = './ddl plugins > listed.txt; ./ddl train --nproc 0 || echo "exit $?"'
    relayed = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    listed = (tmp_path / "listed.txt").read_text()
    cli_relay.write_ddl(tmp_path, relay=False)
    direct = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert (relayed.stdout, relayed.stderr) == (direct.stdout, direct.stderr)
    assert relayed.stdout == "exit 2\n" and "--nproc" in relayed.stderr, relayed
    assert listed == (tmp_path / "listed.txt").read_text() and "xsum" in listed


def _run_block(page: str, block: str, cwd: Path) -> None:
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{page}:\n{block}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


@pytest.mark.parametrize("page", SEQUENTIAL_PAGES)
def test_marked_commands_run(page, tmp_path):
    blocks = runnable_blocks((REPO / page).read_text())
    assert blocks, f"{page} marks no runnable block"
    cli_relay.write_ddl(tmp_path)
    for block in blocks:
        _run_block(page, block, tmp_path)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Per page of STEP_PAGES, a directory where its first block (the data) has run."""
    made: dict[str, Path] = {}

    def directory(page: str) -> Path:
        if page not in made:
            made[page] = tmp_path_factory.mktemp("page")
            cli_relay.write_ddl(made[page])
            _run_block(page, runnable_blocks((REPO / page).read_text())[0], made[page])
        return made[page]

    return directory


def _steps() -> list:
    return [pytest.param(page, index, id=f"{page}:{index}")
            for page in STEP_PAGES
            for index in range(1, len(runnable_blocks((REPO / page).read_text())))]


@pytest.mark.parametrize(("page", "index"), _steps())
def test_marked_step_runs(page, index, prepared):
    """One step of a page whose steps need only its first block: separate tests, so the
    tutorial's runs spread over the test workers instead of one 2-minute test. Then the
    step's "Measured here" claims hold for what the block just wrote (issue 24, item 5)."""
    directory = prepared(page)
    text = (REPO / page).read_text()
    _run_block(page, runnable_blocks(text)[index], directory)
    for shown, holds in CLAIMS.get((page, index), []):
        assert shown in " ".join(text.split()), f"{page} no longer says {shown!r}"
        assert holds(directory / "runs"), f"{page} step {index}: {shown!r} does not hold"


# --- what the tutorial's "Measured here" paragraphs claim, checked on the block's run -------
# Each claim: the words the page shows (whitespace-normalised) and a check of the run
# directories the block wrote. Sizes are deterministic; losses are printed to 3 decimals.

def _results(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "results.json").read_text())


def _state(runs: Path, name: str) -> list[int]:
    return [m["model_state_bytes"] for m in _results(runs, name)["memory_per_rank"]]


def _kb(runs: Path, name: str) -> list[int]:
    return [round(b / 1000) for b in _state(runs, name)]


def _mb(runs: Path, name: str) -> list[float]:
    return [round(b / 1e6, 1) for b in _state(runs, name)]


def _loss(runs: Path, name: str) -> float:
    return round(_results(runs, name)["final"]["test"]["loss"], 3)


def _bubble(runs: Path) -> bool:
    report = _results(runs, "pp")["strategy_report"]
    return (report["bubble_theory"] == pytest.approx(0.2)
            and all(0 <= b < 1 for b in report["bubble_measured_per_rank"]))


T = "docs/tutorial.md"
CLAIMS = {
    (T, 1): [("model state 96 kB", lambda r: _kb(r, "one") == [96]),
             ("test loss 2.290 after 3 steps", lambda r: _loss(r, "one") == 2.290),
             ("(`threads` in results.json: 2 here, on 2 cores;",
              lambda r: _results(r, "one")["threads"]["per_rank"]
              == len(os.sched_getaffinity(0)) or "OMP_NUM_THREADS" in os.environ)],
    (T, 2): [("model state per rank 96 kB, as in one process",
              lambda r: _kb(r, "ddp") == [96, 96]),
             ("test loss 2.243, not one process's 2.290", lambda r: _loss(r, "ddp") == 2.243)],
    (T, 4): [("model state per rank 48 kB, half of DDP's 96 kB",
              lambda r: _kb(r, "fsdp") == [48, 48]),
             ("Same test loss as DDP (2.243)", lambda r: _loss(r, "fsdp") == 2.243)],
    (T, 5): [("model state per rank 2.2 MB against the 3.5 MB of the whole model",
              lambda r: _mb(r, "tp") == [2.2, 2.2]
              and round(_results(r, "tp")["parameters"] * 16 / 1e6, 1) == 3.5)],
    (T, 6): [("model state per rank 55 kB and 41 kB", lambda r: _kb(r, "pp") == [55, 41]),
             ("Test loss equal to one process's (2.290)", lambda r: _loss(r, "pp") == 2.290),
             ("The bubble the block prints: the theory's 0.2", _bubble)],
    (T, 7): [("model state per rank 1.1 MB, a third of the whole model's 3.5 MB and half of "
              "TP's 2.2 MB", lambda r: _mb(r, "2d") == [1.1] * 4),
             ("test loss 5.614 after 3 steps", lambda r: _loss(r, "2d") == 5.614)],
}


def test_every_measured_here_of_a_step_page_is_checked():
    """A new "Measured here" paragraph needs its claims above (or it is not measured here)."""
    for page in STEP_PAGES:
        parts = (REPO / page).read_text().split("<!-- runnable-on-cpu -->")
        for index, part in enumerate(parts[1:], start=0):
            if "Measured here" in part:
                assert CLAIMS.get((page, index)), f"{page}: block {index}'s claims unchecked"
