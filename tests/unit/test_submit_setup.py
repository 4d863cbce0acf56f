"""`ddl submit --setup LINE`: the user's own environment lines (JSC's courses `source
.../activate.sh` before the launch) run in the job after the site's setup, before the
launch. They are the user's shell, so they are written as given (not quoted); each must be
one line, and together they must pass `bash -n`.

The script is run under bash with stand-ins for the Slurm commands (no cluster here) to
see that the lines really run in order, before srun, and what they set reaches srun.
"""

import pytest

from conftest import assert_one_line_error, run_ddl
from sbatch_harness import render, run_script

pytestmark = pytest.mark.unit

LUMI = ["--site", "lumi-g", "--plugin", "mnist", "--nodes", "2"]


def test_lines_follow_the_sites_setup_as_given(capsys):
    setup = ['source "/project/proj/my env/activate.sh"', "export X=$HOME/y  # a comment"]
    lines = render(capsys, *LUMI, "--setup", setup[0], "--setup", setup[1]).splitlines()
    site = lines.index("module load lumi-aif-singularity-bindings")
    assert lines[site + 1:site + 4] == ["# Your setup (--setup), as given", *setup]
    assert lines.index("module use /appl/local/laifs/modules") < site


def test_lines_run_in_the_job_before_the_launch(capsys, tmp_path):
    env_file = tmp_path / "activate.sh"
    env_file.write_text('export DDL_TEST_ENV="from activate"\necho "activated: $UNSET_VAR"\n')
    order = tmp_path / "order"
    script = render(capsys, *LUMI, "--setup", f"source {env_file}",
                    "--setup", f'echo setup >> {order}; srun() {{ echo srun >> {order}; }}')
    proc, _ = run_script(script, tmp_path, nodes=["nid1", "nid2"], hosts={"nid1": "10.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    # ran after `set -euo pipefail` without tripping on an unset variable (set +u around)
    assert "activated: " in proc.stdout
    assert order.read_text() == "setup\nsrun\n"


def test_values_from_setup_reach_the_launch(capsys, tmp_path):
    script = render(capsys, *LUMI, "--setup", "export DDL_FROM_SETUP=yes",
                    "--setup", 'srun() { echo "srun sees $DDL_FROM_SETUP"; }')
    proc, _ = run_script(script, tmp_path, nodes=["nid1"], hosts={"nid1": "10.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    assert "srun sees yes" in proc.stdout


def test_a_block_may_span_several_lines(capsys):
    script = render(capsys, *LUMI, "--setup", "if [ -d /p/x ]; then", "--setup",
                    "  source /p/x/activate.sh", "--setup", "fi")
    assert "if [ -d /p/x ]; then\n  source /p/x/activate.sh\nfi\n" in script


@pytest.mark.parametrize("line", ["source a.sh\nrm -rf ~", "a\rb", "x\x1b[2J"])
def test_newline_or_control_character_is_one_line(line):
    proc = run_ddl("submit", *LUMI, "--account", "proj", "--dry-run", "--setup", line)
    assert_one_line_error(proc, "--setup: ", "newline or control character",
                          "allowed: one shell line per --setup")
    assert proc.stdout == ""


@pytest.mark.parametrize("lines", [["if true; then"], ["source (x"], ["fi"], ["echo 'open"],
                                   ["cat <<EOF"]])  # a bash warning: it would eat the launch
def test_bad_bash_is_one_line_naming_setup(lines):
    args = [a for line in lines for a in ("--setup", line)]
    proc = run_ddl("submit", *LUMI, "--account", "proj", "--dry-run", *args)
    assert_one_line_error(proc, "--setup: not valid bash: ")
    assert proc.stdout == ""


def test_setup_is_not_forwarded_to_train(capsys):
    script = render(capsys, *LUMI, "--setup", "module load x")
    train = [line for line in script.splitlines() if "train --site" in line]
    assert len(train) == 1 and "--setup" not in train[0]
    assert "module load x" in script.splitlines()


def test_with_setup_the_job_calls_the_ddl_its_setup_provides():
    """`--setup 'source VENV/bin/activate'` is how a course puts its ddl on PATH; the job
    then calls that `ddl`, not the submitting venv's by absolute path (issue 42)."""
    def launch(*args: str) -> str:
        proc = run_ddl("submit", *LUMI, "--account", "proj", "--dry-run", *args)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("train --site"))
        return lines[at - 1].removesuffix(" \\") + " " + lines[at].strip()

    assert "/bin/ddl train --site" in launch()  # no setup: this installation's ddl
    with_setup = launch("--setup", "source /p/venv/bin/activate")
    assert " ddl train --site" in with_setup and "/bin/ddl" not in with_setup, with_setup
    chosen = launch("--setup", "module load x", "--ddl-command", "/opt/ddl/bin/ddl")
    assert "/opt/ddl/bin/ddl train --site" in chosen


@pytest.mark.parametrize("site, extra", [
    ("lumi-g", []), ("juwels-booster", []), ("lumi-g", ["--device", "cpu"]),
    ("lumi-g", ["--setup", "source /p/venv/bin/activate"])])
def test_a_torch_that_cannot_drive_the_sites_gpus_is_warned_about(site, extra):
    """Without --container or --setup the job runs this venv's torch; a CUDA torch
    submitting to LUMI got no word (issue 42). Read without importing torch."""
    from ddl.launch.environment import build_mismatch, installed_torch
    from ddl.settings.sites import get_site

    proc = run_ddl("submit", "--site", site, "--plugin", "mnist", "--nodes", "1",
                   "--account", "proj", "--dry-run", *extra)
    assert proc.returncode == 0, proc.stderr
    build = installed_torch()
    expected = (not extra and build is not None
                and build_mismatch(build, site, get_site(site).accelerator))
    warnings = [l for l in proc.stderr.splitlines() if l.startswith("ddl: warning: ")]
    if expected:
        assert len(warnings) == 1 and "no --container: the job runs " in warnings[0]
        assert expected in warnings[0] and "give --container IMAGE" in warnings[0]
    else:
        assert warnings == [], proc.stderr
