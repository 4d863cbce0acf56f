"""Generated shell is safe: user values with spaces, quotes, $(...), backticks and newlines
either reach `ddl train` as inert literal strings, or are rejected with one line.

Each example renders a real script, checks `bash -n`, then runs it under bash (with
stand-ins for the Slurm commands) and compares what srun received with what was typed.
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ddl.commands.cli import main
from ddl.contract.errors import UsageError
from ddl.launch.submit import check_syntax
from sbatch_harness import FIXED, render, run_script

pytestmark = pytest.mark.unit

NASTY = st.sampled_from([" ", "'", '"', "$(touch PWNED)", "`touch PWNED`", "\n", "\\", ";",
                         "$HOME", "*", "&", "|", "#", "!", "%", "é"])
VALUES = st.lists(st.one_of(NASTY, st.text(min_size=1, max_size=4).filter(
    lambda s: "\x00" not in s)), min_size=1, max_size=6).map("".join)
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data_dir=VALUES, option=VALUES)
@example(data_dir="a\rb $(touch PWNED)", option="x'\n`touch PWNED`")
def test_run_values_arrive_literally(capsys, tmp_path, data_dir, option):
    # Free text that reaches the job's command line: a data dir on the job's file system
    # (a top directory this machine lacks, so submit leaves its existence to the job) and
    # a strategy option's value (its name is checked before the queue, its value in the job)
    where = f"/nonexistent-fs/{data_dir}"
    script = render(capsys, "--site", "lumi-g", "--nodes", "2", "--plugin", "mnist",
                    f"--data-dir={where}",  # "=": values may start with "-"
                    f"--strategy-option=bucket_cap_mb={option}")
    check_syntax(script)
    proc, args = run_script(script, tmp_path, nodes=["nid1", "nid2"], hosts={"nid1": "10.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    assert f"--data-dir={Path(where).resolve()}" in args
    assert f"--strategy-option=bucket_cap_mb={option}" in args
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


@SETTINGS
@given(account=VALUES, job_name=VALUES)
def test_sbatch_values_are_safe_or_rejected(capsys, account, job_name):
    capsys.readouterr()
    # --opt=value: a value may begin with "-" (as separate words argparse would read it as
    # an option and refuse it, which says nothing about the sbatch quoting under test)
    argv = ["submit", *FIXED[2:], "--site", "jureca-dc", f"--account={account}",
            f"--job-name={job_name}"]
    try:
        code = main(argv)
    except UsageError:  # main() reports UsageErrors itself; it should never raise
        pytest.fail("UsageError escaped main()")
    out = capsys.readouterr()
    if code == 0:
        assert f"#SBATCH --account={account}\n" in out.out
        assert f"#SBATCH --job-name={job_name}\n" in out.out
        check_syntax(out.out)
    else:
        assert code == 2 and out.out == ""
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and "cannot go into an #SBATCH line" in lines[0], out.err


def test_newline_in_account_is_rejected(capsys):
    code = main(["submit", *FIXED[2:], "--site", "jureca-dc", "--account", "a\n#SBATCH --x"])
    err = capsys.readouterr().err
    assert code == 2 and "--account" in err and len(err.strip().splitlines()) == 1
