"""Bad input: one line naming the problem and what is allowed, exit code 2, no traceback,
and nothing already written is damaged. Each case runs the real `ddl` command."""

import hashlib

import pytest

from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("args, needles", [
    (["train", "--plugin", "cifar99"], ["--plugin", "'cifar99'", "allowed:", "mnist"]),
    (["train", "--strategy", "zero9"], ["--strategy", "'zero9'", "allowed:", "ddp"]),
    (["train", "--nproc", "0"], ["--nproc", "greater than or equal to 1", "got 0"]),
    (["train", "--nproc", "two"], ["--nproc", "invalid int value: 'two'"]),
    (["train", "--preset", "huge"], ["--preset", "'huge'", "allowed: course, throughput, tiny"]),
    (["train", "--batch-size", "3", "--global-batch-size", "8"],
     ["--global-batch-size: 8 is not a multiple of --batch-size 3", "allowed: multiples of"]),
    (["train", "--device", "tpu"], ["--device", "invalid choice: 'tpu'"]),
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    # issue 43: an empty run dir is the cwd; flags that passed, then failed every run
    (["train", "--run-dir", ""], ["--run-dir", "empty path", "allowed:"]),
    (["train", "--run-dir="], ["--run-dir", "empty path", "allowed:"]),
    (["train", "--hang-timeout", "0.001"], ["--hang-timeout", "allowed: 0 (off) or 1 to"]),
    (["train", "--warmup-epochs", "1e308"], ["--warmup-epochs", "less than or equal to"]),
    (["train", "--live-every", "0"], ["--live-every", "greater than or equal to 0.5"]),
    (["train", "--live-every", "nan"], ["--live-every", "finite number"]),
    (["train", "--mesh", "dp=2,dp=4"], ["--mesh", "'dp' is named twice", "allowed:"]),
])
def test_bad_flags(tmp_path, args, needles):
    assert_one_line_error(run_ddl(*args, cwd=tmp_path), *needles)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_data_dir_that_does_not_exist(tmp_path):
    proc = run_ddl("train", "--data-dir", str(tmp_path / "nope"), cwd=tmp_path)
    assert_one_line_error(proc, "--data-dir", "nope", "does not exist", "ddl prepare")


def test_data_dir_that_is_a_file(tmp_path):
    (tmp_path / "data").write_text("not a directory")
    proc = run_ddl("train", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert_one_line_error(proc, "--data-dir", "is not a directory", "ddl prepare")
    assert (tmp_path / "data").read_text() == "not a directory"


def test_data_dir_it_may_not_read(tmp_path):
    """Issue 43: a data dir of mode 000 (as a user whom modes bind) was a 22-line
    traceback, exit 1. A fresh interpreter: the modes bind only a process started so."""
    import os

    from conftest import DDL, run_bounded
    from unprivileged import bound_by_modes

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        proc = run_bounded(bound_by_modes([DDL, "train", "--data-dir", str(locked),
                                           "--run-dir", str(tmp_path / "run")]),
                           timeout=300, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        locked.chmod(0o755)
    assert_one_line_error(proc, "--data-dir: cannot read", "locked", "Permission denied",
                          "allowed:")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["-5", "nan"])
def test_ddp_bucket_size_must_be_a_positive_number(tmp_path, value):
    proc = run_ddl("train", "--strategy", "ddp", "--strategy-option", f"bucket_cap_mb={value}",
                   "--nproc", "2", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(proc, f"bucket_cap_mb='{value}'", "allowed: a number above 0")
    assert not (tmp_path / "run").exists()


def test_data_dir_without_mnist(tmp_path):
    proc = run_ddl("train", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(proc, "no MNIST data", "ddl prepare --plugin mnist")


@pytest.mark.parametrize("damage", ["truncate", "magic", "label"])
def test_corrupt_data_files(mnist_copy, tmp_path, damage):
    raw = mnist_copy / "MNIST" / "raw"
    if damage == "truncate":
        path = raw / "train-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:5000])
    elif damage == "magic":
        path = raw / "t10k-labels-idx1-ubyte"
        path.write_bytes(b"\x00\x00\x09\x99" + path.read_bytes()[4:])
    else:
        path = raw / "train-labels-idx1-ubyte"
        blob = bytearray(path.read_bytes())
        blob[20] = 11
        path.write_bytes(bytes(blob))
    proc = run_ddl("train", "--data-dir", str(mnist_copy), cwd=tmp_path)
    assert_one_line_error(proc, path.name, "ddl prepare --plugin mnist")


def test_existing_run_is_not_damaged(tmp_path, synthetic_mnist):
    run_dir = tmp_path / "old-run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text('{"precious": true}\n')
    (run_dir / "model.pt").write_bytes(b"weights")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.iterdir()}
    proc = run_ddl("train", "--run-dir", str(run_dir), "--data-dir", str(synthetic_mnist),
                   cwd=tmp_path)
    assert_one_line_error(proc, "--run-dir", "already holds a run")
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.iterdir()}
    assert before == after


def test_config_file_errors(tmp_path):
    proc = run_ddl("train", "--config", str(tmp_path / "missing.toml"), cwd=tmp_path)
    assert_one_line_error(proc, "--config", "does not exist")
    bad = tmp_path / "run.toml"
    bad.write_text("nproc = -1\n")
    assert_one_line_error(run_ddl("train", "--config", str(bad), cwd=tmp_path), "--nproc", "greater than or equal to 1")


def test_prepare_real_download_fails_clearly_offline(tmp_path):
    """This machine cannot reach the MNIST mirrors; the real download code must say so."""
    proc = run_ddl("prepare", "--plugin", "mnist", "--data-dir", str(tmp_path / "d"),
                   timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "could not download MNIST" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "d" / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


def test_a_reader_that_goes_away_is_no_error():
    """`ddl sites | head -1`: the pipe closes before ddl has written everything."""
    import subprocess

    from conftest import DDL

    proc = subprocess.Popen([DDL, "sites"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # nobody reads: ddl's writes fail with EPIPE
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_resume_from_a_path_without_a_checkpoint_is_one_line(tmp_path, synthetic_mnist):
    proc = run_ddl("train", "--data-dir", str(synthetic_mnist), "--run-dir",
                   str(tmp_path / "r"), "--resume", str(tmp_path / "nothing-here"), cwd=tmp_path)
    assert_one_line_error(proc, "--resume", "nothing-here", "allowed: none, auto")
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.parametrize("args, why", [
    (["--site", "lumi"], "site lumi-g has rocm GPUs"),
    (["--device", "cuda"], "--device cuda"),
])
def test_gpu_expected_but_none_visible(mnist_copy, tmp_path, args, why):
    """This machine has no GPU (torch.cuda.is_available() is False here for real): a GPU
    site or --device cuda is refused before any worker starts, pointing at --device cpu."""
    import torch

    if torch.cuda.is_available():  # runs on every CI machine (none has a GPU)
        pytest.skip("checks the refusal on a machine without a GPU")
    proc = run_ddl("train", *args, "--data-dir", str(mnist_copy), cwd=tmp_path)
    assert_one_line_error(proc, why, "torch sees no GPU", "--device cpu")
    assert not (tmp_path / "runs").exists()
