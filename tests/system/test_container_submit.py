"""`ddl submit --container` against a real Apptainer and the real CPU image (both from
tests/system/conftest.py: `runtime_env`, `image`).

- The image's `ddl.target` label is read with `apptainer inspect --labels` at submit: the
  CPU image is refused for lumi-g (a ROCm site) in one line naming the label and the site,
  and renders for the CPU site local-slurm (and for lumi-g with --device cpu).
- The container words the batch script runs (ddl.launch.container_launch: the bind block, then
  `apptainer run "${ddl_binds[@]}" IMAGE`) make a data directory outside the cwd, $HOME
  and /tmp (all bound by Apptainer by default) visible inside: the image's ddl trains on
  it and writes results.json to the run directory on the host, though the site's bind
  list names a source missing here (which Apptainer alone would refuse, FATAL). Without
  the data directory's bind the same command cannot see the data.

Here the script's bind block and launch words run under bash directly, not through
sbatch/srun (the Slurm part is covered by tests/system/test_slurm.py). This machine's
Apptainer (provide-apptainer) runs inside bubblewrap, which shows it only /tmp, the cwd
and the paths in APPTAINER_SHIM_BINDS: the test directory is listed there; on a real
host Apptainer sees every path. Not covered: singularity (LUMI), --nv/--rocm (no GPU).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from ddl.launch.container_launch import HostDir, bind_lines, entry
from ddl.settings.sites import Container, get_site

pytestmark = pytest.mark.system

SUBMIT = ["submit", "--account", "proj", "--dry-run", "--plugin", "mnist"]


def test_cpu_image_is_refused_for_a_rocm_site(runtime_env, image, tmp_path):
    proc = run_ddl(*SUBMIT, "--site", "lumi-g", "--container", str(image), cwd=tmp_path,
                   env=runtime_env)
    assert_one_line_error(proc, f"--container: {image} is labelled ddl.target=cpu",
                          "site lumi-g needs a rocm image")
    assert proc.stdout == ""


@pytest.mark.parametrize("site, extra", [("local-slurm", []), ("lumi-g", ["--device", "cpu"])])
def test_cpu_image_renders_where_it_can_run(runtime_env, image, tmp_path, site, extra):
    proc = run_ddl(*SUBMIT, "--site", site, "--container", str(image), *extra, cwd=tmp_path,
                   env=runtime_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no "not checked" note: the runtime was there
    assert f' "${{ddl_binds[@]}}" {image} \\\n' in proc.stdout


def _launch_script(site, image: Path, data: Path, run_dir: Path, bind_data=True) -> str:
    dirs = [HostDir('"$run_dir"', run_dir, "--run-dir")]
    if bind_data:
        dirs.append(HostDir(shlex.quote(str(data)), data, "--data-dir"))
    # a short run: what is checked is where the data and the results are
    train = ["train", "--site", "local", "--plugin", "mnist", "--preset", "tiny", "--nproc",
             "1", "--epochs", "1", "--steps-per-epoch", "3", "--data-dir",
             shlex.quote(str(data)), '--run-dir "$run_dir"']
    return "\n".join([f"run_dir={shlex.quote(str(run_dir))}", *bind_lines(site, dirs),
                      " ".join([*entry(site, str(image)), *train])])


def test_data_dir_outside_cwd_and_home_is_visible_inside(runtime_env, image, synthetic_mnist,
                                                         tmp_path):
    root = Path(tempfile.mkdtemp(prefix="ddl-bindtest-", dir=REPO.parent))  # not in /tmp
    try:
        data = root / "data"
        shutil.copytree(synthetic_mnist, data)
        (tmp_path / "cwd").mkdir()
        (tmp_path / "home").mkdir()
        env = {**runtime_env, "HOME": str(tmp_path / "home"), "APPTAINER_SHIM_BINDS": str(root)}
        missing = root / "not-on-this-node"  # a site bind whose source is missing here
        site = get_site("local-slurm")
        site = site.model_copy(update={"container": Container(binds=[str(missing)])})

        def run(script: str) -> subprocess.CompletedProcess:
            return subprocess.run(["bash", "-euo", "pipefail", "-c", script],
                                  cwd=tmp_path / "cwd", env=env, capture_output=True,
                                  text=True, timeout=600)

        run_dir = root / "runs" / "bound"
        proc = run(_launch_script(site, image, data, run_dir))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"ddl: note: {missing} does not exist on " in proc.stderr
        results = json.loads((run_dir / "results.json").read_text())
        assert results["data"]["dir"] == str(data)

        # Control: Apptainer alone stops on the missing source; and without the binds the
        # data directory is not there inside.
        direct = run(f"apptainer exec -B {missing} {image} true")
        assert direct.returncode != 0 and "FATAL" in direct.stderr, direct.stderr
        unbound = root / "runs" / "unbound"
        proc = run(_launch_script(site, image, data, unbound, bind_data=False))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"--data-dir: {data} does not exist" in proc.stderr
        assert not (unbound / "results.json").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
