"""The Imagewoof plugin through the real `ddl` command: discovered from its installed entry
point, listed with its presets, and bad or missing data give one line (exit 2 / exit 1)."""

import shutil
from importlib import metadata
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_ddl
from ddl_imagewoof import data, synthetic

pytestmark = pytest.mark.unit


@pytest.fixture(scope="session")
def imagewoof_synthetic(tmp_path_factory) -> Path:
    """Shared with test_imagewoof_data.py through the session's base temp directory."""
    root = tmp_path_factory.getbasetemp() / "imagewoof-synthetic"
    if not data.is_synthetic(root):
        synthetic.write_synthetic(root, 60, 20, seed=0)
    return root


def test_entry_point_is_installed():
    ep = {e.name: e for e in metadata.entry_points(group="ddl")}["imagewoof"]
    assert ep.value == "ddl_imagewoof.plugin" and ep.dist.name == "ddl-imagewoof"


def test_ddl_plugins_lists_imagewoof_with_presets(tmp_path):
    proc = run_ddl("plugins", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.split()[:1] == ["imagewoof"])
    assert "xresnet50" in lines[i]
    assert ("presets: course (default), throughput, tiny, tiny-exact, tiny-ghostbn; from "
            "ddl-imagewoof 0.1.0") in lines[i + 1]
    support = next(line for line in lines[i + 2:] if line.split()[:1] == ["imagewoof"])
    assert support.split()[1] == "yes"  # ddp
    assert "BROKEN" not in proc.stdout


@pytest.mark.parametrize("how", ["truncate", "not-jpeg"])
def test_corrupt_file_is_one_line_via_the_cli(imagewoof_synthetic, tmp_path, how):
    copy = tmp_path / "data"
    shutil.copytree(imagewoof_synthetic, copy)
    top = copy / "imagewoof2-320"
    if how == "truncate":
        victim = sorted((top / "train" / "n02099601").iterdir())[7]
        victim.write_bytes(victim.read_bytes()[:4000])
    else:
        victim = top / "val" / "n02087394" / "ILSVRC2012_val_00099999.JPEG"
        victim.write_text("Access Denied\n")
    proc = run_ddl("train", "--plugin", "imagewoof", "--preset", "tiny", "--data-dir",
                   str(copy), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(proc, str(victim), "ddl prepare --plugin imagewoof")
    assert not (tmp_path / "run").exists()


def test_missing_data_is_one_line(tmp_path):
    proc = run_ddl("train", "--plugin", "imagewoof", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(proc, "no Imagewoof data", "ddl prepare --plugin imagewoof")


def test_prepare_real_download_fails_clearly_offline(tmp_path):
    """This machine cannot reach fastai's S3 bucket; the real download code must say so."""
    proc = run_ddl("prepare", "--plugin", "imagewoof", "--data-dir", str(tmp_path / "d"),
                   timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(lines) == 1 and "could not download Imagewoof" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "d" / "imagewoof2-320").exists()
