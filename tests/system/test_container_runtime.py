"""ddl inside the CPU image, run by the real Apptainer: it knows it is in a container, it
refuses a run directory the container would take with it, and a data directory that exists
on the host but is not bound says so.

The image and the runtime come from tests/system/conftest.py (one build per test run).
The provided Apptainer runs inside a bubblewrap root that shows it only /tmp, the cwd and
the paths in APPTAINER_SHIM_BINDS; a host directory the runtime must see goes there (on a
real host the runtime sees every path). Whether that directory then appears *inside* the
container is Apptainer's own decision: bound by default (cwd, $HOME, /tmp) or with -B.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error

from .conftest import apptainer

pytestmark = pytest.mark.system

TINY = ("train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "1")


@pytest.fixture
def host_data_dir(synthetic_mnist):
    """MNIST in a host directory Apptainer does not bind by default: not under /tmp, $HOME
    or the test's cwd (beside the checkout, e.g. /work/ddl-data-XXXX)."""
    parent = REPO.parent
    home = Path(os.path.expanduser("~")).resolve()
    for default in (Path("/tmp"), home):
        if parent.resolve().is_relative_to(default):
            pytest.fail(f"{parent} is under {default}, which Apptainer binds by default; "
                        "this test needs the checkout's parent elsewhere")
    root = Path(tempfile.mkdtemp(prefix="ddl-data-", dir=parent))
    shutil.copytree(synthetic_mnist, root / "mnist")
    yield root / "mnist"
    shutil.rmtree(root)


def _sees(env: dict[str, str], path: Path) -> dict[str, str]:
    shim = [p for p in (env.get("APPTAINER_SHIM_BINDS", ""), str(path)) if p]
    return {**env, "APPTAINER_SHIM_BINDS": os.pathsep.join(shim)}


def test_containall_run_dir_is_refused_before_training(runtime_env, image, tmp_path):
    """--containall: the cwd becomes the in-memory $HOME, so runs/ would vanish on exit."""
    proc = apptainer(runtime_env, "run", "--containall", str(image), *TINY, cwd=tmp_path)
    line = assert_one_line_error(proc, "--run-dir: ", "is on a memory filesystem (tmpfs",
                                 "lost when it exits", "apptainer run -B HOST_DIR")
    assert re.search(r"--run-dir: /\S*/runs/mnist-ddp-\d{8}-\d{6} ", line), line
    assert "epoch" not in proc.stdout  # refused before training, not after
    assert not (tmp_path / "runs").exists()


def test_unbound_data_dir_says_it_is_missing_inside_and_bound_it_trains(
        runtime_env, image, tmp_path, host_data_dir):
    env = _sees(runtime_env, host_data_dir)
    unbound = apptainer(env, "run", str(image), *TINY, "--data-dir", str(host_data_dir),
                        cwd=tmp_path)
    assert_one_line_error(unbound, f"--data-dir: {host_data_dir} does not exist inside the "
                          f"container ({image})", f"bind it (apptainer run -B {host_data_dir}",
                          "ddl prepare")
    assert not (tmp_path / "runs").exists()

    # a short run: what is checked is where the data and the results are, not the training
    bound = apptainer(env, "run", "-B", str(host_data_dir), str(image), *TINY, "--epochs", "1",
                      "--steps-per-epoch", "3", "--data-dir", str(host_data_dir), cwd=tmp_path)
    assert bound.returncode == 0, bound.stdout + bound.stderr
    match = re.search(r"^results: (\S+)$", bound.stdout, re.M)
    assert match, bound.stdout
    results_file = tmp_path / match.group(1)  # on the host: the cwd was bound
    assert results_file.is_file() and results_file.is_relative_to(tmp_path)
    results = json.loads(results_file.read_text())
    assert results["data"] == {"dir": str(host_data_dir), "synthetic": True}
    assert results["command"][0].startswith("/usr/local/"), results["command"]  # the image's


def test_doctor_inside_the_image_knows_it(runtime_env, image, tmp_path):
    """No runtime on PATH inside is expected, not a failure; the torch build is checked
    against the site."""
    local = apptainer(runtime_env, "run", str(image), "doctor", "--site", "local",
                      cwd=tmp_path)
    assert local.returncode == 0, local.stdout + local.stderr
    assert f"ok   container: inside a container ({image}, target " in local.stdout
    assert "neither apptainer nor singularity" not in local.stdout
    lumi = apptainer(runtime_env, "run", str(image), "doctor", "--site", "lumi-g",
                     cwd=tmp_path)
    assert lumi.returncode == 1
    assert "cannot use lumi-g's ROCm GPUs" in lumi.stdout, lumi.stdout
