"""benchmarks' --data-dir PLUGIN=DIR: each value names a plugin and a directory; a malformed
one ends the script with exit 2 and argparse's usage plus one error line naming the value,
before any data is prepared or anything measured."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

sys.path.insert(0, str(REPO / "benchmarks"))
import argparse  # noqa: E402

from data_flags import add_data_dir_flag, given_data_dirs  # noqa: E402


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_data_dir_flag(parser)
    return given_data_dirs(parser, parser.parse_args(list(argv)).data_dir)


def test_values_map_plugins_to_directories(tmp_path):
    assert _parse() == {}
    assert _parse("--data-dir", f"xsum={tmp_path}/a=b", "--data-dir", "mnist=m") == {
        "xsum": tmp_path / "a=b", "mnist": Path("m")}


@pytest.mark.parametrize("script", ["overhead.py", "overhead_instructions.py",
                                    "block_options.py"])
@pytest.mark.parametrize("value", ["xsum", "=data", "xsum="])
def test_a_malformed_value_is_one_line_and_exit_2(script, value):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--data-dir",
                           value], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == (f"{script}: error: --data-dir {value!r}: expected "
                                            "PLUGIN=DIR, e.g. mnist=data/mnist")
