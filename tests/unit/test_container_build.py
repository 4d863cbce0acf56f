"""`ddl container build`: the command it gives the real runtime (printed by --dry-run), how it
finds `apptainer` or else `singularity`, and its refusals. The real build runs in
tests/system/test_container.py.

Runtimes "on PATH" here are empty stand-in executables in a temporary directory: only
their presence is looked at (no build runs in these tests).
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from test_no_torch import PROBE

pytestmark = pytest.mark.unit


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    for name in ("ddl-0.1.0-py3-none-any.whl", "ddl_mnist-0.1.0-py3-none-any.whl"):
        (wh / name).write_bytes(b"")
    return wh


def _path_with(tmp_path, *names) -> dict[str, str]:
    """PATH holding only stand-ins for the given runtimes (and nothing else to find)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return {"PATH": str(bin_dir)}


def _dry_run(tmp_path, wheelhouse, *args, env=None) -> list[str]:
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"), *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout.strip().splitlines()[-1])


def _build_args(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, w in enumerate(cmd) if w == "--build-arg")


def test_local_base_becomes_localimage(tmp_path, wheelhouse):
    base = tmp_path / "debian-root"
    base.mkdir()
    cmd = _dry_run(tmp_path, wheelhouse, "--base", str(base), "--no-compress", "--offline",
                   env=_path_with(tmp_path, "apptainer"))
    assert cmd[:2] == [str(tmp_path / "bin" / "apptainer"), "build"]
    assert cmd[cmd.index("--mksquashfs-args") + 1] == "-noI -noD -noF -noX"
    args = _build_args(cmd)
    assert args["BOOTSTRAP"] == "localimage" and args["FROM"] == str(base)
    assert args["WHEELHOUSE"] == str(wheelhouse)
    assert args["PIP_OPTIONS"] == "--no-index"  # --offline: the wheelhouse only
    assert args["DDL_COMMIT"] and args["BUILD_DATE"].endswith("Z")
    assert cmd[-2:] == [str(tmp_path / "out.sif"), str(REPO / "containers" / "cpu.def")]


def test_registry_base_and_user_build_args(tmp_path, wheelhouse):
    cmd = _dry_run(tmp_path, wheelhouse, "--target", "cuda",
                   "--base", "docker://nvcr.io/nvidia/pytorch:24.01-py3",
                   "--build-arg", "PIP_OPTIONS=--index-url https://pypi.example/simple")
    args = _build_args(cmd)
    assert (args["BOOTSTRAP"], args["FROM"]) == ("docker", "nvcr.io/nvidia/pytorch:24.01-py3")
    assert args["PIP_OPTIONS"] == "--index-url https://pypi.example/simple"
    assert cmd[-1].endswith("containers/cuda.def")
    assert "--mksquashfs-args" not in cmd


def test_without_base_the_definition_default_stays(tmp_path, wheelhouse):
    args = _build_args(_dry_run(tmp_path, wheelhouse))
    assert "BOOTSTRAP" not in args and "FROM" not in args  # docker python image (cpu.def)
    assert "PIP_OPTIONS" not in args  # the definition's: PyTorch's CPU index


def test_singularity_is_used_when_apptainer_is_missing(tmp_path, wheelhouse):
    cmd = _dry_run(tmp_path, wheelhouse, env=_path_with(tmp_path, "singularity"))
    assert cmd[0] == str(tmp_path / "bin" / "singularity")


def test_apptainer_is_preferred_unless_singularity_is_asked_for(tmp_path, wheelhouse):
    env = _path_with(tmp_path, "apptainer", "singularity")
    assert Path(_dry_run(tmp_path, wheelhouse, env=env)[0]).name == "apptainer"
    cmd = _dry_run(tmp_path, wheelhouse, "--runtime", "singularity", env=env)
    assert Path(cmd[0]).name == "singularity"


def test_neither_runtime_says_so(tmp_path, wheelhouse):
    proc = run_ddl("container", "build", "--wheelhouse", str(wheelhouse), "--output",
                   str(tmp_path / "out.sif"), env=_path_with(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert lines == ["ddl: error: neither apptainer nor singularity is on PATH: install "
                     "Apptainer (apptainer.org) or load the site's module; `ddl container "
                     "check` works without either"]


@pytest.mark.parametrize("args, needles", [
    (["--base", "/no/such/root"], ["--base: /no/such/root does not exist", "docker://REF"]),
    (["--base", "http://x/y"], ["--base: 'http://x/y' has an unknown scheme"]),
    (["--def", "/no/such.def"], ["--def: /no/such.def is not a file"]),
    (["--target", "gpu"], ["invalid choice: 'gpu'"]),
    (["--build-arg", "NOEQUALS"], ["'NOEQUALS' is not KEY=VALUE"]),
])
def test_bad_input_is_one_line(tmp_path, wheelhouse, args, needles):
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"), *args)
    assert_one_line_error(proc, *needles)


def test_existing_image_is_not_replaced_without_force(tmp_path, wheelhouse):
    (tmp_path / "out.sif").write_bytes(b"an image")
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"))
    assert_one_line_error(proc, "out.sif exists; pass --force")
    cmd = _dry_run(tmp_path, wheelhouse, "--force")
    assert "--force" in cmd
    assert (tmp_path / "out.sif").read_bytes() == b"an image"


def test_empty_wheelhouse_names_the_script(tmp_path):
    empty = tmp_path / "wh"
    empty.mkdir()
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(empty),
                   "--output", str(tmp_path / "out.sif"))
    assert_one_line_error(proc, f"--wheelhouse: no ddl wheel in {empty}",
                          f"scripts/build-wheelhouse.sh {empty}")


def test_broken_definition_stops_before_the_build(tmp_path, wheelhouse):
    broken = tmp_path / "broken.def"
    broken.write_text("Bootstrap: docker\nFrom: debian:12\n%psot\n    true\n")
    proc = run_ddl("container", "build", "--dry-run", "--def", str(broken), "--wheelhouse",
                   str(wheelhouse), "--output", str(tmp_path / "out.sif"))
    assert_one_line_error(proc, f"{broken}:3: unknown section %psot")
    # --no-check hands it to the runtime unread (its own parser reports it; system test)
    cmd = _dry_run(tmp_path, wheelhouse, "--def", str(broken), "--no-check")
    assert cmd[-1] == str(broken)


@pytest.mark.parametrize("args", [
    ["container", "--help"], ["container", "check", "--target", "cuda", "--base", "/"],
    ["container", "build", "--dry-run", "--base", "/", "--output", "/tmp/ddl-probe.sif"],
])
def test_container_commands_do_not_import_torch(args, wheelhouse):
    args = args + (["--wheelhouse", str(wheelhouse)] if len(args) > 2 else [])
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("HEAVY:"), proc.stdout
