"""What the shipped definitions promise, read from the files (no build): the CPU image
refuses a GPU torch at build time, carries what `ddl report` needs, and every image has
the OCI annotation labels. The real CPU build runs in tests/system/test_container.py.
"""

import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from ddl.launch.container_def import parse

pytestmark = pytest.mark.unit

CPU_DEF = REPO / "containers" / "cpu.def"


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


def test_cpu_image_installs_what_report_and_tensorboard_need():
    """`apptainer run IMAGE report RUN` draws with matplotlib; runs write TensorBoard
    events: the core's plots and tensorboard extras are installed."""
    post = "\n".join(_post(CPU_DEF))
    assert '"$core[plots,tensorboard]"' in post
    extras = "EXTRAS=\"[plots,tensorboard]\""  # and the offline wheelhouse resolves them
    assert extras in (REPO / "scripts" / "build-wheelhouse.sh").read_text()


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
