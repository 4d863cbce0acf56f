"""scripts/bootstrap.sh's cached venv: the lock is installed once per machine, and each
new .venv gets hard links to it (the full lock takes pip ~80 s on 2 cores; linking ~5 s).

Run on a copy of the bootstrap with a small real lock (hatchling, its five dependencies
and `editables`: their entries and hashes from requirements.lock) and one editable package,
so that the test installs for real from pip's index without laying down torch's 6 GB.
The full lock goes the same way in every fresh clone's `./run-tests`."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.system

SMALL_LOCK = ("editables", "hatchling", "packaging", "pathspec", "pluggy", "tomlkit",
              "trove-classifiers")


def _small_root(root: Path) -> Path:
    (root / "scripts").mkdir(parents=True)
    for name in ("bootstrap.sh", "lock.py", "venv_link.py"):
        shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
    text = (REPO / "requirements.lock").read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    entry = re.compile(r"^([a-z0-9-]+)==\S+ \\\n(?:\s+--hash=\S+(?: \\)?\n)+", re.M)
    entries = [m[0] for m in entry.finditer(text) if m[1] in SMALL_LOCK]
    assert len(entries) == len(SMALL_LOCK), entries
    (root / "requirements.lock").write_text(header + "".join(entries))
    (root / "requirements-dev.txt").write_text("-e packages/core\n")
    core = root / "packages" / "core"
    (core / "src" / "probe").mkdir(parents=True)
    (core / "src" / "probe" / "__init__.py").write_text("def main():\n    print('probe ok')\n")
    (core / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "probe"\nversion = "0"\n[project.scripts]\nprobe = "probe:main"\n')
    (root / "packages" / "plugins" / "none").mkdir(parents=True)
    (root / "packages" / "plugins" / "none" / "pyproject.toml").write_text("")
    return root


def _bootstrap(root: Path, venv: Path, cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDL_VENV": str(venv), "DDL_DEPS_CACHE": cache}
    return subprocess.run(["bash", "-c", f'source "{root}/scripts/bootstrap.sh"'], env=env,
                          capture_output=True, text=True, timeout=600)


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_the_lock_is_installed_once_and_linked_into_each_new_venv(tmp_path):
    root = _small_root(tmp_path / "clone")
    cache = tmp_path / "cache"
    first = _bootstrap(root, tmp_path / "one", str(cache))
    assert first.returncode == 0, first.stderr
    assert "installing requirements.lock into" in first.stderr, first.stderr
    second = _bootstrap(root, tmp_path / "two", str(cache))
    assert second.returncode == 0, second.stderr
    assert "installing requirements.lock" not in second.stderr, second.stderr
    assert "linked the locked packages" in second.stderr, second.stderr

    [cached] = [p for p in cache.iterdir() if p.is_dir()]
    two = tmp_path / "two"
    # the same files, not copies: one inode
    module = Path("hatchling") / "__init__.py"
    assert (_site(two) / module).stat().st_ino == (_site(cached) / module).stat().st_ino
    # a venv of its own: its Python, its console scripts, its editable package, pip's view
    out = subprocess.run([two / "bin" / "python", "-c", "import hatchling, sys; "
                          "print(sys.prefix); print(hatchling.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(two), str(_site(two) / module)]
    assert (two / "bin" / "hatchling").read_text().startswith(f"#!{two}/bin/python\n")
    assert subprocess.run([two / "bin" / "probe"], capture_output=True,
                          text=True).stdout == "probe ok\n"
    assert subprocess.run([two / "bin" / "python", "-m", "pip", "check"]).returncode == 0
    # pip in a linked venv replaces files, it does not write into the cache's
    subprocess.run([two / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "pathspec"],
                   check=True)
    assert not list(_site(two).glob("pathspec*"))
    assert (_site(cached) / "pathspec" / "__init__.py").is_file()
    assert subprocess.run([cached / "bin" / "python", "-m", "pip", "check"]).returncode == 0


def test_no_cache_installs_into_the_venv_itself(tmp_path):
    root = _small_root(tmp_path / "clone")
    proc = _bootstrap(root, tmp_path / "venv", "off")
    assert proc.returncode == 0, proc.stderr
    assert "linked" not in proc.stderr and "installing requirements.lock" not in proc.stderr
    assert (_site(tmp_path / "venv") / "hatchling" / "__init__.py").stat().st_nlink == 1
