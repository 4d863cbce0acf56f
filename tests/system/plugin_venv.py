"""An example plugin installed as a third party installs it: into a fresh venv beside ddl.

The fresh venv: `python -m venv --without-pip` gives an empty environment in seconds; a
`.pth` file there calls site.addsitedir() on the project's .venv, so ddl, torch and pip come
from the project's environment (reinstalling torch would take minutes). The plugin itself is
built from a copy of its directory (setuptools writes build/ into the source) and installed
by pip into the fresh venv only (not editable, build isolation off so no index is needed:
setuptools comes from .venv). The project's own `ddl plugins` does not see it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from conftest import run_bounded


def install_in_fresh_venv(source: Path, root: Path, module: str) -> Path:
    """A venv at ``root``/venv holding the plugin at ``source`` (a copy of it beside the
    venv: ``root``/<source's name>); ``module`` is the package the install must bring."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    project_site = sysconfig.get_paths()["purelib"]  # of the interpreter running the tests
    (Path(purelib) / "ddl-project-env.pth").write_text(
        f"import site; site.addsitedir({project_site!r})\n")
    copy = shutil.copytree(source, root / source.name,
                           ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps",
                           "--no-build-isolation", str(copy)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (Path(purelib) / module / "plugin.py").is_file()  # a real copy, not a link
    return venv


def ddl_in(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`ddl ARGS` with the venv's interpreter (its plugins)."""
    command = "import sys; from ddl.commands.cli import main; sys.exit(main())"
    return run_bounded([str(venv / "bin" / "python"), "-c", command, *args], cwd=cwd,
                       timeout=600)


def run_plugin_tests(venv: Path, basetemp: Path) -> subprocess.CompletedProcess:
    """The plugin's own tests/ (the copy the venv was installed from), run as its author
    would: pytest in the venv, the plugin's pyproject.toml as the configuration."""
    plugin = next(p for p in venv.parent.iterdir() if (p / "pyproject.toml").is_file())
    return run_bounded([str(venv / "bin" / "python"), "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", "--rootdir", str(plugin),
                        "-c", str(plugin / "pyproject.toml"), "--basetemp", str(basetemp),
                        str(plugin / "tests")], cwd=basetemp.parent, timeout=900)


def listed_in_venv_only(venv: Path, workload: str, cwd: Path) -> tuple[str, str]:
    """`ddl plugins` in the venv lists ``workload`` and nothing broken, and the project's own
    `ddl plugins` does not list it: (the workload's line, the whole listing)."""
    from conftest import run_ddl

    proc = ddl_in(venv, "plugins", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert "BROKEN" not in proc.stdout
    line = next(line for line in proc.stdout.splitlines() if line.split()[:1] == [workload])
    project = run_ddl("plugins", cwd=cwd)
    assert project.returncode == 0
    assert workload not in [row.split()[0] for row in project.stdout.splitlines() if row.split()]
    return line, proc.stdout
