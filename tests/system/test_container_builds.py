"""Small real builds (no torch): how `ddl container build` behaves when a build's %post
fails, and the CUDA definition's install step against a base that pins like NVIDIA's.

Apptainer is the real one (tests/system/conftest.py). The CUDA base here is a stand-in,
since NGC is unreachable and there is no GPU: provide-apptainer's Debian root (hard links)
plus what matters of nvcr.io/nvidia/pytorch for this step — `torch` and `torchvision`
distributions at NVIDIA-style versions (metadata and a stub module; nothing imports them
beyond their version), `/etc/pip/constraint.txt` with pins of the kind NVIDIA's file
holds, and `PIP_CONSTRAINT` set in the image's environment file, where Apptainer puts a
docker image's ENV (`.singularity.d/env/10-docker2singularity.sh`). The pins chosen clash
with transformers 5 as NVIDIA's 25.03 notes report: regex and safetensors older than it
requires.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_ddl

from .conftest import BASE, apptainer

pytestmark = pytest.mark.system

NV_TORCH = "2.8.0a0+5228986c39.nv25.06"  # the form of NGC's versions: a pre-release + tag
NV_PINS = {"torch": NV_TORCH, "regex": "2024.11.6", "safetensors": "0.5.3"}


def _last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_real_apptainer_is_recognised_and_gets_its_options(runtime_env, tmp_path):
    from ddl.launch.container_build import detect_runtime

    runtime = detect_runtime(shutil.which("apptainer", path=runtime_env["PATH"]))
    assert runtime.flavour == "apptainer" and runtime.version >= (1, 2), runtime
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / "ddl-0.1.0-py3-none-any.whl").write_bytes(b"")
    proc = run_ddl("container", "build", "--dry-run", "--no-compress", "--base", str(BASE),
                   "--wheelhouse", str(tmp_path / "wh"), "--output", str(tmp_path / "x.sif"),
                   env=runtime_env, fresh=True)  # PATH differs: a fork would exec anyway
    assert proc.returncode == 0, proc.stderr
    assert "--mksquashfs-args '-noI -noD -noF -noX'" in proc.stdout


def test_failed_post_names_the_section_and_the_cause(runtime_env, tmp_path):
    """Apptainer's own last line is "while running %post section: exit status 127"; ddl's
    one line says which command, at which line of the definition."""
    definition = tmp_path / "x.def"
    definition.write_text(f"Bootstrap: localimage\nFrom: {BASE}\n\n%post\n    set -eu\n"
                          "    echo preparing\n    nosuchcommand --flag\n    echo never\n"
                          "\n%runscript\n    exec ddl \"$@\"\n")
    proc = run_ddl("container", "build", "--def", str(definition), "--wheelhouse",
                   str(tmp_path), "--no-compress", "--output", str(tmp_path / "x.sif"),
                   cwd=tmp_path, env=runtime_env, timeout=600, fresh=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "exit status 127" in proc.stderr  # the runtime's FATAL, shown as it came
    assert _last_line(proc) == ("ddl: error: apptainer build failed (exit 255): in %post: "
                                f"{definition}:7: nosuchcommand: not found")
    assert not (tmp_path / "x.sif").exists()


def _fake_dist(site: Path, name: str, version: str, module: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    (site / name).mkdir()
    (site / name / "__init__.py").write_text(module)


@pytest.fixture
def nvidia_like_base(tmp_path) -> Path:
    root = tmp_path / "ngc-standin"
    shutil.copytree(BASE, root, symlinks=True, copy_function=os.link)  # same disk: links
    site = next((root / "usr" / "local" / "lib").glob("python3*")) / "dist-packages"
    _fake_dist(site, "torch", NV_TORCH, f"__version__ = {NV_TORCH!r}\n"
               "from . import version\n")
    (site / "torch" / "version.py").write_text("cuda = '12.9'\nhip = None\n")
    _fake_dist(site, "torchvision", "0.23.0a0+428a54c9", "__version__ = '0.23.0a0'\n")
    (root / "etc" / "pip").mkdir(parents=True)
    (root / "etc" / "pip" / "constraint.txt").write_text(
        "".join(f"{k}=={v}\n" for k, v in NV_PINS.items()))
    env = root / ".singularity.d" / "env"
    env.mkdir(parents=True)
    (env / "10-docker2singularity.sh").write_text(
        'export PIP_CONSTRAINT="${PIP_CONSTRAINT:-/etc/pip/constraint.txt}"\n')
    return root


@pytest.fixture
def gpu_wheelhouse(cpu_wheelhouse, tmp_path) -> Path:
    """The CPU image's wheelhouse (hard links) less its torch and torchvision: cuda.def
    keeps the base's pair (keep-base.txt), so those ~200 MB would only be copied into the
    build and deleted."""
    wheelhouse = tmp_path / "wheelhouse-gpu"
    wheelhouse.mkdir()
    for path in cpu_wheelhouse.iterdir():
        if not path.name.startswith(("torch-", "torchvision-")):
            os.link(path, wheelhouse / path.name)
    return wheelhouse


def test_cuda_install_step_survives_nvidia_style_pip_constraint(runtime_env, tmp_path,
                                                                nvidia_like_base,
                                                                gpu_wheelhouse):
    """containers/cuda.def itself (its %test needs a real CUDA torch: skipped with
    --no-test). The install succeeds; the base's torch is kept; the moved pins are listed.
    pip skips byte-compiling (PIP_OPTIONS, with --offline's --no-index): nothing this test
    checks, and most of the install's CPU (34 CPU-s with it, 8-12 without, measured)."""
    sif = tmp_path / "cuda.sif"
    proc = run_ddl("container", "build", "--target", "cuda", "--base", str(nvidia_like_base),
                   "--wheelhouse", str(gpu_wheelhouse), "--offline", "--no-compress",
                   "--build-arg", "PIP_OPTIONS=--no-index --no-compile",
                   "--no-test", "--output", str(sif), env=runtime_env, timeout=1500,
                   cwd=REPO,  # the provided apptainer sees /tmp and its cwd only
                   fresh=True)  # runtime_env's PATH would send a fork to exec anyway
    assert proc.returncode == 0, proc.stderr[-4000:]
    # it did meet the clash (so this proves the fallback, not a lucky resolution)
    assert "ddl: the base's PIP_CONSTRAINT (/etc/pip/constraint.txt) clashes" in proc.stderr
    assert f"moved the base's pin regex=={NV_PINS['regex']}" in proc.stderr
    versions = apptainer(runtime_env, "exec", str(sif), "python3", "-c",
                         "from importlib.metadata import version as v; "
                         "print(v('torch'), v('transformers'), v('regex'))", cwd=tmp_path)
    assert versions.returncode == 0, versions.stderr
    torch, transformers, regex = versions.stdout.split()
    assert torch == NV_TORCH  # never replaced
    assert transformers.startswith("5.") and regex != NV_PINS["regex"]
    target = apptainer(runtime_env, "exec", str(sif), "sh", "-c",
                       'echo "$DDL_CONTAINER_TARGET $PIP_CONSTRAINT"', cwd=tmp_path)
    assert target.stdout.split() == ["cuda", "/etc/pip/constraint.txt"]  # base env kept
