"""Partition limits checked at `ddl submit`, before anything reaches sbatch: `--time` above
the partition's max_time and `--nodes` above its max_nodes are refused in one line, exit 2
(LUMI's dev-g allows 3 h and 32 nodes, small-g 3 days and 4 nodes [facts: sites.md]).

Slurm's time forms (sbatch --time): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, and
INFINITE/UNLIMITED; the first field is open (90:00 is 90 minutes), the clock fields after
it are ranged (99:99:99 is refused: tests/unit/test_submit_sized.py).
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import assert_one_line_error, run_ddl
from ddl.launch.submit import slurm_seconds

pytestmark = pytest.mark.unit

LUMI = ["submit", "--site", "lumi-g", "--account", "proj", "--dry-run"]


@pytest.mark.parametrize("value, seconds", [
    ("30", 30 * 60),                        # MM
    ("90", 90 * 60),                        # MM beyond an hour
    ("30:15", 30 * 60 + 15),                # MM:SS
    ("02:00:00", 2 * 3600),                 # HH:MM:SS
    ("1:2:3", 3600 + 120 + 3),              # single digits
    ("48:00:00", 48 * 3600),                # hours beyond a day
    ("2-12", 2 * 86400 + 12 * 3600),        # D-HH
    ("1-00:30", 86400 + 30 * 60),           # D-HH:MM
    ("3-00:00:00", 3 * 86400),              # D-HH:MM:SS
    ("0-00:00:01", 1),
])
def test_slurm_time_forms(value, seconds):
    assert slurm_seconds(value) == seconds


@pytest.mark.parametrize("value", ["INFINITE", "unlimited", "0", "00:00:00", "0-0"])
def test_no_limit(value):
    assert slurm_seconds(value) is None


@pytest.mark.parametrize("value", ["", "1h", "1:2:3:4", "-1", "1-", "1--2", "1-2:3:4:5",
                                   " 10", "10 ", "1.5", "1-2-3", ":30", "30:"])
def test_not_a_slurm_time(value):
    with pytest.raises(ValueError, match="is not a Slurm time; allowed: MM, MM:SS, HH:MM:SS, "
                                         "D-HH, D-HH:MM, D-HH:MM:SS"):
        slurm_seconds(value)


@given(d=st.integers(0, 30), h=st.integers(0, 23), m=st.integers(0, 59), s=st.integers(0, 59))
def test_every_form_agrees_with_the_arithmetic(d, h, m, s):
    total = ((d * 24 + h) * 60 + m) * 60 + s
    assert slurm_seconds(f"{d}-{h:02d}:{m:02d}:{s:02d}") == (total or None)
    assert slurm_seconds(f"{d * 24 + h}:{m}:{s}") == (total or None)
    assert slurm_seconds(f"{d}-{h}:{m}") == (total - s or None)
    assert slurm_seconds(f"{d}-{h}") == (total - s - 60 * m or None)
    assert slurm_seconds(f"{(d * 24 + h) * 60 + m}:{s}") == (total or None)


def test_time_above_the_partition_limit_is_one_line():
    proc = run_ddl(*LUMI, "--partition", "dev-g", "--time", "04:00:00")
    assert_one_line_error(proc, "--time: partition dev-g of lumi-g allows at most 03:00:00 "
                                "(got 04:00:00)")
    assert proc.stdout == ""


@pytest.mark.parametrize("value", ["2-23:59:59", "UNLIMITED", "0"])
def test_no_limit_or_more_than_standard_g_allows_is_refused(value):
    proc = run_ddl(*LUMI, "--time", value, "--nodes", "1")
    if value == "2-23:59:59":
        assert_one_line_error(proc, "allows at most 2-00:00:00", f"(got {value})")
    else:
        assert_one_line_error(proc, f"(got {value})")


@pytest.mark.parametrize("partition, time", [("dev-g", "03:00:00"), ("dev-g", "180"),
                                             ("small-g", "3-00"), ("standard-g", "48:00:00")])
def test_time_at_the_limit_renders(partition, time):
    proc = run_ddl(*LUMI, "--partition", partition, "--time", time)
    assert proc.returncode == 0, proc.stderr
    assert f"#SBATCH --time={time}\n" in proc.stdout


def test_bad_time_form_is_one_line():
    proc = run_ddl(*LUMI, "--time", "2h")
    assert_one_line_error(proc, "--time: '2h' is not a Slurm time; allowed: MM, MM:SS")


def test_nodes_above_the_partition_limit_is_one_line():
    proc = run_ddl(*LUMI, "--partition", "small-g", "--nodes", "5")
    assert_one_line_error(proc, "--nodes: partition small-g of lumi-g allows at most 4 nodes "
                                "(got 5)")


def test_site_without_a_time_limit_takes_any_time():
    """JSC's partitions list no max_time (not in the facts): nothing to check against."""
    proc = run_ddl("submit", "--site", "juwels-booster", "--account", "proj", "--dry-run",
                   "--time", "7-00:00:00")
    assert proc.returncode == 0, proc.stderr


def test_bad_max_time_in_a_profile_names_the_file(tmp_path):
    from conftest import REPO

    profile = (REPO / "sites" / "lumi-g.toml").read_text().replace(
        'name = "lumi-g"', 'name = "lumi-x"').replace('max_time = "03:00:00"', 'max_time = "3h"')
    (tmp_path / "lumi-x.toml").write_text(profile)
    proc = run_ddl("submit", "--site", "lumi-x", "--partition", "dev-g", "--dry-run",
                   env={"DDL_SITE_PATH": str(tmp_path)})
    assert_one_line_error(proc, f"{tmp_path / 'lumi-x.toml'}: partitions.dev-g.max_time: "
                                "'3h' is not a Slurm time")
