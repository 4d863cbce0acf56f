"""`ddl check-plugin chargpt` as a plugin author runs it: the GPT example
(docs/examples/ddl-gpt-plugin) installed into a fresh venv (tests/system/plugin_venv.py),
the command started from another directory with relative --work-dir and --data-dir, which
it creates. Only accelerate, blocked for the command and every process it starts
(sitecustomize.py on PYTHONPATH sets ``sys.modules["accelerate"] = None``, so its import
fails for real): it must come out UNAVAILABLE, not FAIL, after the in-process checks and the
meta build. So no `ddl train` is launched (one process and ddp took 15 of the test's 21
CPU-s): chargpt's runs in a fresh venv, ddp included, are the full kit in
tests/system/test_gpt_example_plugin.py, and `ddl check-plugin` launching real runs into a
relative --work-dir is tests/distributed/test_conformance_tp.py.
"""

from __future__ import annotations

import os

import pytest
from conftest import REPO, run_bounded

from .plugin_venv import install_in_fresh_venv

pytestmark = pytest.mark.system

GPT = REPO / "docs" / "examples" / "ddl-gpt-plugin"
DDL = "import sys; from ddl.commands.cli import main; sys.exit(main())"


def test_check_plugin_from_another_directory_with_relative_paths(tmp_path):
    venv = install_in_fresh_venv(GPT, tmp_path / "third-party", "ddl_gpt")
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text("import sys; sys.modules['accelerate'] = None\n")
    here = tmp_path / "elsewhere"
    here.mkdir()
    proc = run_bounded([str(venv / "bin" / "python"), "-c", DDL, "check-plugin", "chargpt",
                        "--work-dir", "kit/out", "--data-dir", "../shared-data",
                        "--strategies", "accelerate", "--checks", "strategies"],
                       cwd=here, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(block)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # the relative paths, resolved against the command's directory
    assert lines[0] == f"checking workload 'chargpt' (preset tiny) in {here / 'kit' / 'out'}"
    assert f"PASS        data: {tmp_path / 'shared-data'}" in lines, lines
    assert any(l.startswith("PASS") and "datasets" in l for l in lines), lines
    assert ("UNAVAILABLE strategy:accelerate: strategy unavailable: install "
            "ddl-strategies[accelerate]") in lines, lines
    assert not any(l.startswith("FAIL") for l in lines), lines
    assert lines[-1] == "chargpt: 6 passed, 0 failed, 1 unavailable", lines[-1]
    assert any(l.startswith("PASS        meta-build: ") and "bit for bit" in l
               for l in lines), lines
    assert (here / "kit" / "out").is_dir()  # created
    assert any((tmp_path / "shared-data").iterdir())  # the generated data, beside `here`
    assert not (here / "kit" / "out" / "data").exists()
