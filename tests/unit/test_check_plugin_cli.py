"""`ddl check-plugin` refuses bad input in one line, and a strategy whose dependency is
missing is listed by `ddl plugins` as unavailable, supported by no workload.

"Missing" is made real for a child process: a PYTHONPATH entry whose sitecustomize.py sets
``sys.modules["accelerate"] = None``, Python's own way of blocking a module (its import
raises ImportError, importlib.util.find_spec answers None), since this venv has
accelerate installed and uninstalling it would change the environment for everyone.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

DDL = [sys.executable, "-c", "import sys; from ddl.commands.cli import main; sys.exit(main())"]


def blocked_env(tmp_path, module: str) -> dict:
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(f"import sys; sys.modules[{module!r}] = None\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(block), *filter(None, [os.environ.get("PYTHONPATH")])])}


def ddl(*args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*DDL, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, says", [
    (["nope"], "unknown plugin 'nope'"),
    (["mnist", "--strategies", "warp"], "--strategies: unknown warp"),
    (["mnist", "--preset", "huge"], "--preset 'huge'"),
    (["mnist", "--tolerance", "loose"], "unknown rule 'loose'"),
    (["mnist", "--tolerance", "nan"], "--tolerance: unknown rule 'nan'; allowed: auto, "),
    (["mnist", "--work-dir", ""], "an empty path would mean the current directory"),
    (["mnist", "--data-dir", ""], "an empty path would mean the current directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = ddl("check-plugin", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir()), "refused, yet it wrote"  # no check ran first
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_block_is_real(tmp_path):
    env = blocked_env(tmp_path, "accelerate")
    proc = subprocess.run([sys.executable, "-c", "import accelerate"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "halted; None in sys.modules" in proc.stderr, proc.stderr


def test_plugins_lists_a_strategy_without_its_dependency_as_unavailable(tmp_path):
    plain = ddl("plugins", cwd=tmp_path).stdout
    blocked = ddl("plugins", cwd=tmp_path, env=blocked_env(tmp_path, "accelerate")).stdout
    hint = "strategy unavailable: install ddl-strategies[accelerate]"
    assert hint not in plain
    line = next(l for l in blocked.splitlines() if l.lstrip().startswith("accelerate "))
    assert line.endswith(f"({hint})"), line
    rows = {l.split()[0]: l.split()[1:] for l in blocked.split("Support")[1].splitlines()[2:]}
    header = blocked.split("Support")[1].splitlines()[1].split()
    column = header.index("accelerate")
    assert rows and all(cells[column] == "n/a" for cells in rows.values()), rows
    plain_rows = plain.split("Support")[1].splitlines()[2:]
    assert all(l.split()[1:][column] == "yes" for l in plain_rows), plain_rows

