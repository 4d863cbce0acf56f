"""What the shipped definitions promise, read from the files (no build): the CPU image
refuses a GPU torch at build time, every image carries what `ddl report` needs, and every
image has the OCI annotation labels. The real CPU build runs in tests/system/test_container.py.
"""

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import REPO
from ddl.launch.container_def import parse

pytestmark = pytest.mark.unit

CPU_DEF = REPO / "containers" / "cpu.def"
IMAGE_DEFS = sorted((REPO / "containers").glob("*.def"))


def _post(path: Path) -> list[str]:
    stage = parse(path)[-1]
    line = next(n for n, name, _ in stage.sections if name == "post")
    return stage.bodies[line]


def _cpu_torch_check() -> str:
    """The %post lines from the CPU-torch check's comment to its closing `fi`."""
    body = _post(CPU_DEF)
    start = next(i for i, l in enumerate(body) if l.strip() == "# A CPU torch, or stop: with "
                 "PyTorch's CPU index unreachable, --extra-index-url quietly")
    end = next(i for i in range(start, len(body)) if body[i] == "    fi")
    return "\n".join(body[start:end + 1])


@pytest.mark.parametrize("library, refused", [
    (None, False), ("libtorch_cuda.so", True), ("libtorch_hip.so", True),
    ("libtorch_cpu.so", False)])
def test_cpu_image_build_stops_on_a_gpu_torch(tmp_path, library, refused):
    """With PyTorch's CPU index unreachable, pip's --extra-index-url falls back to PyPI's
    CUDA torch without a word (issue 42); %post then stops with pip-style ERROR line,
    which `ddl container build` repeats as its one-line cause."""
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    if library:
        (lib / library).write_bytes(b"")
    proc = subprocess.run(["sh", "-c", f"set -eu\nsite={tmp_path}\n{_cpu_torch_check()}\n"
                           "echo passed"], capture_output=True, text=True, timeout=30)
    if refused:
        assert proc.returncode == 1, proc.stdout
        assert proc.stdout.startswith("ERROR: torch ") and "is a GPU build" in proc.stdout
        assert "scripts/build-wheelhouse.sh --cpu-torch" in proc.stdout
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "passed", proc.stderr


def _install_commands(post: list[str]) -> list[list[str]]:
    """The words of each `pip install` command in %post, continuation lines joined."""
    text = "\n".join(post).replace("\\\n", " ")
    return [shlex.split(line.split("pip install", 1)[1], comments=True)
            for line in text.splitlines() if "pip install" in line]


def _core_extras(path: Path) -> set[str]:
    """The extras each image's %post installs the ddl core wheel with (empty: none)."""
    post = _post(path)
    core = [shlex.split(l.strip())[0].split("=", 1)[1] for l in post
            if l.strip().startswith("core=")]
    extras = set()
    for words in _install_commands(post):
        for word in words:
            spec = re.fullmatch(r"(\$core|\$wh/ddl-\*\.whl)(?:\[([\w,]*)\])?", word)
            if spec:
                # $core: the core wheel, by file name
                assert spec.group(1) != "$core" or core == ["$(ls $wh/ddl-*.whl)"], core
                extras.update(filter(None, (spec.group(2) or "").split(",")))
    return extras


def test_the_core_extras_are_matplotlib_and_tensorboard():
    with open(REPO / "packages" / "core" / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert extras["plots"][0].startswith("matplotlib") and \
        extras["tensorboard"][0].startswith("tensorboard"), extras
    wheelhouse = "EXTRAS=\"[plots,tensorboard]\""  # and the offline wheelhouse holds them
    assert wheelhouse in (REPO / "scripts" / "build-wheelhouse.sh").read_text()


@pytest.mark.parametrize("path", IMAGE_DEFS, ids=lambda p: p.name)
def test_every_image_installs_what_report_and_tensorboard_need(path):
    """`apptainer run IMAGE report RUN` draws with matplotlib; runs write TensorBoard
    events: every image installs the core with its plots and tensorboard extras (issue 42:
    the CUDA and ROCm images had neither)."""
    extras = _core_extras(path)
    assert {"plots", "tensorboard"} <= extras, f"{path.name} installs the core with {extras}"


@pytest.mark.parametrize("path", [p for p in IMAGE_DEFS if p.name != "cpu.def"],
                         ids=lambda p: p.name)
def test_gpu_images_check_the_extras_import(path):
    """The GPU images are built elsewhere (a registry, LUMI): their %test says at once when
    the two do not import (the CPU image's report runs in tests/system/test_container.py)."""
    stage = parse(path)[-1]
    line = next(n for n, name, _ in stage.sections if name == "test")
    body = [l.strip() for l in stage.bodies[line]]
    assert 'python3 -c "import matplotlib, tensorboard"' in body, path.name


@pytest.mark.parametrize("target", ["cpu", "cuda", "rocm"])
def test_every_image_has_the_oci_labels(target):
    path = REPO / "containers" / f"{target}.def"
    stage = parse(path)[-1]
    line = next(n for n, name, _ in stage.sections if name == "labels")
    labels = dict(l.split(None, 1) for l in stage.bodies[line] if l.strip())
    assert labels["org.opencontainers.image.revision"] == "{{ DDL_COMMIT }}"
    assert labels["org.opencontainers.image.created"] == "{{ BUILD_DATE }}"
    assert labels["org.opencontainers.image.base.name"] == "{{ FROM }}"
    assert labels["org.opencontainers.image.title"] == f"ddl ({target} image)"
    # the version comes from the installed ddl, in %post
    assert "echo \"org.opencontainers.image.version $(ddl --version" in "\n".join(_post(path))


# --- issue 52, item 11 ----------------------------------------------------------------------
def _section(path: Path, name: str) -> str:
    stage = parse(path)[-1]
    line = next(n for n, section, _ in stage.sections if section == name)
    return "\n".join(stage.bodies[line])


ENTRYPOINTS = {"cuda.def": "/opt/nvidia/nvidia_entrypoint.sh",  # NGC's ENTRYPOINT
               "rocm.def": "/opt/oci-entrypoint.sh"}  # lumi-multitorch's (laifs recipes)


@pytest.mark.parametrize("name", sorted(ENTRYPOINTS))
def test_runscript_goes_through_the_bases_entrypoint_with_ddls_stdout_clean(tmp_path, name):
    """`apptainer run` of the GPU images runs ddl through the base's entrypoint (NGC's
    driver check; lumi-multitorch's one-node libfabric setting), as a run of the base
    would; the entrypoint's banner goes to stderr and what it exports reaches ddl."""
    entry = tmp_path / "entrypoint.sh"
    entry.write_text("#!/bin/sh\necho '== NVIDIA banner =='\nexport FROM_ENTRY=yes\n"
                     'exec "$@"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ddl").write_text('#!/bin/sh\necho "ddl $* entry=$FROM_ENTRY"\n')
    for script in (entry, bin_dir / "ddl"):
        script.chmod(0o755)
    body = _section(REPO / "containers" / name, "runscript")
    assert ENTRYPOINTS[name] in body
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    for present in (True, False):
        script = body.replace(ENTRYPOINTS[name], str(entry if present else tmp_path / "none"))
        proc = subprocess.run(["sh", "-c", script, "runscript", "sites", "--all"],
                              capture_output=True, text=True, timeout=30, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"ddl sites --all entry={'yes' if present else ''}\n"
        assert ("NVIDIA banner" in proc.stderr) is present


def test_rocm_image_starts_from_the_lumi_ai_guides_multitorch_image():
    """LUMI's AI guide (LUMI-AI-Guide 02-setting-up-environment, a7e3387) runs the LUMI AI
    Factory's lumi-multitorch images; the older CSC image stays a --base option."""
    args = dict(line.strip().split("=", 1) for line in
                _section(REPO / "containers" / "rocm.def", "arguments").splitlines()
                if "=" in line)
    assert args["FROM"].startswith("/appl/local/laifs/containers/lumi-multitorch-")
    assert "/lumi-multitorch-full-" in args["FROM"] and args["FROM"].endswith(".sif")
    post = _section(REPO / "containers" / "rocm.def", "post")
    assert "/opt/venv/bin" in post  # lumi-multitorch's Python, no conda
    assert "python3 -m pip check" in post and "pip-check-base.txt" in post


def test_rocm_pip_check_fails_only_on_what_the_install_added(tmp_path):
    """The %post lines from `pip check` after the install to their `fi`, with pip check's
    output given: the base's own broken requirement passes, a new one stops the build."""
    post = _section(REPO / "containers" / "rocm.def", "post").splitlines()
    start = next(i for i, l in enumerate(post)
                 if l.strip().startswith("python3 -m pip check > /opt/ddl/pip-check.txt"))
    end = next(i for i in range(start, len(post)) if post[i] == "    fi")
    block = "\n".join(post[start + 1:end + 1]).replace("/opt/ddl", str(tmp_path))
    base = "vllm 0.9.0 has requirement xformers==0.0.30, but you have xformers 0.0.29."
    (tmp_path / "pip-check-base.txt").write_text(base + "\n")
    for after, fails in ((base, False), ("No broken requirements found.", False),
                         (base + "\ndeepspeed 0.17 has requirement numpy<2, but you have "
                                 "numpy 2.3.", True)):
        (tmp_path / "pip-check.txt").write_text(after + "\n")
        proc = subprocess.run(["sh", "-c", f"set -eu\n{block}\necho passed"],
                              capture_output=True, text=True, timeout=30)
        if fails:
            assert proc.returncode == 1 and proc.stdout.startswith("ERROR: after installing")
            assert "deepspeed" in proc.stdout and "vllm" not in proc.stdout
        else:
            assert proc.returncode == 0 and proc.stdout.strip() == "passed", proc.stdout


@pytest.mark.parametrize("name", ["cuda.def", "rocm.def"])
def test_help_names_the_image_the_build_writes(name):
    """One image name everywhere: `ddl container build` writes containers/ddl.sif."""
    text = _section(REPO / "containers" / name, "help")
    assert "containers/ddl.sif" in text
    assert not re.search(r"ddl-(cuda|rocm)\.sif", text)
