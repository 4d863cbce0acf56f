"""The example external plugin (docs/examples/ddl-example-plugin) as a third party uses it:
installed from its directory into a fresh venv beside ddl, listed by `ddl plugins`, trained
on 2 processes, and passing the conformance kit through its own test file.

The fresh venv: `python -m venv --without-pip` gives an empty environment in seconds; a
`.pth` file there calls site.addsitedir() on the project's .venv, so ddl, torch and pip come
from the project's environment (reinstalling torch would take minutes). The plugin itself is
built (from a copy of its directory: setuptools writes build/ into the source) and
installed by pip into the fresh venv only (not editable, build isolation off so no
index is needed: setuptools comes from .venv). The project's own `ddl plugins` must not see it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, run_bounded, run_ddl

pytestmark = pytest.mark.system

EXAMPLE = REPO / "docs" / "examples" / "ddl-example-plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("third-party") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    project_site = sysconfig.get_paths()["purelib"]  # of the interpreter running the tests
    (Path(purelib) / "ddl-project-env.pth").write_text(
        f"import site; site.addsitedir({project_site!r})\n")
    # setuptools builds inside the source tree (build/, *.egg-info): build a copy of it
    source = shutil.copytree(EXAMPLE, root.parent / "ddl-example-plugin",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps",
                           "--no-build-isolation", str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (Path(purelib) / "ddl_example" / "plugin.py").is_file()  # a real copy, not a link
    return root


def _ddl(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = "import sys; from ddl.commands.cli import main; sys.exit(main())"
    return run_bounded([str(venv / "bin" / "python"), "-c", command, *args], cwd=cwd,
                       timeout=600)


def test_listed_in_the_fresh_venv_only(venv, tmp_path):
    proc = _ddl(venv, "plugins", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.split()[:1] == ["example"])
    assert "example plugin" in line
    assert "ddl-example-plugin 0.1.0" in proc.stdout
    assert "BROKEN" not in proc.stdout
    project = run_ddl("plugins", cwd=tmp_path)
    assert project.returncode == 0 and "ddl-example-plugin" not in project.stdout


def test_trains_on_two_processes(venv, tmp_path):
    data = tmp_path / "data"
    proc = _ddl(venv, "prepare", "--plugin", "example", "--synthetic", "--data-dir", str(data),
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (data / "example" / "train.csv").read_text().startswith("x0,x1,")
    proc = _ddl(venv, "train", "--plugin", "example", "--preset", "tiny", "--nproc", "2",
                "--data-dir", str(data), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plugin"] == "example" and results["world"]["size"] == 2
    assert "ddl-example-plugin" in json.dumps(results["versions"]["plugins"])
    first, last = results["epochs"][0]["val"]["loss"], results["final"]["val"]["loss"]
    assert last < first, (first, last)  # it learns


def test_passes_the_conformance_kit(venv, tmp_path):
    """The example's own test file, run as its author would, in the fresh venv."""
    example = venv.parent / "ddl-example-plugin"  # the copy the fixture installed from
    proc = run_bounded([str(venv / "bin" / "python"), "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", "--rootdir", str(example),
                        "-c", str(example / "pyproject.toml"), "--basetemp",
                        str(tmp_path / "kit"), str(example / "tests")],
                       cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
