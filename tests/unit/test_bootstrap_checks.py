"""scripts/bootstrap.sh before it installs anything (issue 42): a python3 below ddl's floor
is named in ddl's words, not pip's; the cached venv (~6 GB) is made only where hard links
from it can reach the venv (by default it sits in $HOME, small at JSC). The install
itself: tests/system/test_bootstrap.py."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"


def test_an_old_python_is_named_before_any_install(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # answers as Python 3.8 would to the version probe
    fake.write_text("#!/bin/sh\necho 3.8\nexit 1\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    proc = subprocess.run(["bash", str(BOOTSTRAP)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DDL_VENV": str(venv),
                                           "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert proc.returncode == 1
    assert "ddl: python3 is Python 3.8; ddl needs Python >= 3.10" in proc.stderr
    assert "pip" not in proc.stderr and not venv.exists()


def _deps_dir(venv: Path, cache: Path) -> str:
    proc = subprocess.run(["bash", "-c", f'source "{BOOTSTRAP}" && _ddl_deps_dir'],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DDL_VENV": str(venv),
                               "XDG_CACHE_HOME": str(cache)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_package_cache_is_made_only_where_links_reach(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    fingerprint = subprocess.run(["bash", str(BOOTSTRAP), "--fingerprint"], check=True,
                                 capture_output=True, text=True).stdout
    (venv / ".ddl-installed").write_text(fingerprint)  # set up: sourcing installs nothing
    assert _deps_dir(venv, tmp_path / "cache").startswith(f"{tmp_path}/cache/ddl/deps/")
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system here")
    away = Path(tempfile.mkdtemp(dir=other))
    try:
        assert _deps_dir(venv, away / "cache") == ""
    finally:
        shutil.rmtree(away)
