"""A run directory on a real, small tmpfs (MNIST tiny, two ranks): the disk fills up during a
checkpoint, the file system turns read-only, then room is made and `--resume auto` finishes.

Needs `mount -t tmpfs` (root, or a container allowed to mount); where that is refused the
test is skipped and says so: there is no other way to get a real full disk here.
"""

import subprocess

import pytest
from small_disk import mounted
from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.distributed


@pytest.fixture
def small_disk(tmp_path):
    with mounted(tmp_path / "disk", "300k") as disk:
        yield disk


def _remount(disk, options):
    subprocess.run(["mount", "-o", f"remount,{options}", str(disk)], check=True)


def test_full_disk_then_read_only_then_room(tmp_path, synthetic_mnist, small_disk):
    run_dir = small_disk / "run"
    args = ["train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "2", "--epochs", "2",
            "--steps-per-epoch", "3", "--checkpoint-every", "1", "--seed", "5",
            "--data-dir", str(synthetic_mnist), "--run-dir", str(run_dir)]
    full = run_ddl(*args, cwd=tmp_path)
    lines = [line for line in full.stderr.splitlines() if line.strip()]
    assert full.returncode == 1 and len(lines) == 1, full.stdout + full.stderr
    assert "Traceback" not in full.stdout + full.stderr
    assert "No space left on device" in lines[0] and "MiB free there" in lines[0], lines[0]
    assert f"cannot write {run_dir / 'checkpoints'}" in lines[0], lines[0]
    intact = lines[0].split("newest complete checkpoint (")[1].split(")")[0]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() in intact

    _remount(small_disk, "ro")
    read_only = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
    assert_one_line_error(read_only, f"cannot write in {run_dir}", "Read-only file system")

    _remount(small_disk, "rw,size=8m")
    resumed = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {intact}" in resumed.stdout
    assert (run_dir / "results.json").is_file() and (run_dir / "model.pt").is_file()
