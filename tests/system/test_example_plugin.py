"""The example external plugin (docs/examples/ddl-example-plugin) as a third party uses it:
installed from its directory into a fresh venv beside ddl (tests/system/plugin_venv.py),
listed by `ddl plugins`, trained on 2 processes, and passing the conformance kit through its
own test file. The project's own `ddl plugins` must not see it.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from .plugin_venv import ddl_in, install_in_fresh_venv, listed_in_venv_only, run_plugin_tests

pytestmark = pytest.mark.system

EXAMPLE = REPO / "docs" / "examples" / "ddl-example-plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return install_in_fresh_venv(EXAMPLE, tmp_path_factory.mktemp("third-party"), "ddl_example")


def test_listed_in_the_fresh_venv_only(venv, tmp_path):
    line, listing = listed_in_venv_only(venv, "example", tmp_path)
    assert "example plugin" in line and "ddl-example-plugin 0.1.0" in listing


def test_trains_on_two_processes(venv, tmp_path):
    data = tmp_path / "data"
    proc = ddl_in(venv, "prepare", "--plugin", "example", "--synthetic", "--data-dir", str(data),
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (data / "example" / "train.csv").read_text().startswith("x0,x1,")
    proc = ddl_in(venv, "train", "--plugin", "example", "--preset", "tiny", "--nproc", "2",
                  "--data-dir", str(data), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plugin"] == "example" and results["world"]["size"] == 2
    assert "ddl-example-plugin" in json.dumps(results["versions"]["plugins"])
    first, last = results["epochs"][0]["val"]["loss"], results["final"]["val"]["loss"]
    assert last < first, (first, last)  # it learns


def test_passes_the_conformance_kit(venv, tmp_path):
    """The example's own test file, run as its author would, in the fresh venv."""
    proc = run_plugin_tests(venv, tmp_path / "kit")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
