"""`scripts/build-wheelhouse.sh --cpu-torch DIR`: the CPU image's torch pair in one command,
taken only from the CPU index (an unreachable one must not mean PyPI's CUDA build), and
refused when the torch it got is a CUDA build anyway.

The script is the real one (it builds ddl's wheels, ~5 s); the index is a small PEP 503
directory of stand-in wheels (metadata only) given as $TORCH_INDEX, at versions no real
wheel store here has. The real CPU index is not reachable from here.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

PAIR = {"torch": "2.0.0+cpu", "torchvision": "0.15.0"}


def _index(root: Path, cuda: bool) -> Path:
    for name, version in PAIR.items():
        cuda_dep = cuda and name == "torch"
        requires = "Requires-Dist: nvidia-cublas-cu12==12.1.3.1\n" if cuda_dep else ""
        wheel = f"{name}-{version}-py3-none-any.whl"
        (root / name).mkdir(parents=True)
        with zipfile.ZipFile(root / name / wheel, "w") as z:
            info = f"{name}-{version.split('+')[0]}.dist-info"
            z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                                           f"Version: {version}\n{requires}")
            z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n")
            z.writestr(f"{info}/RECORD", "")
        (root / name / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>\n')
    return root


def _run(tmp_path: Path, cuda: bool) -> tuple[subprocess.CompletedProcess, Path]:
    index = _index(tmp_path / "index", cuda)
    out = tmp_path / "wheelhouse"
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-wheelhouse.sh"), "--cpu-torch", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable, "TORCH_INDEX": index.as_uri(),
             "TORCH": " ".join(f"{n}=={v}" for n, v in PAIR.items())})
    return proc, out


def test_cpu_torch_pair_lands_in_the_wheelhouse(tmp_path):
    proc, out = _run(tmp_path, cuda=False)
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.glob("*.whl")}
    assert {"torch-2.0.0+cpu-py3-none-any.whl", "torchvision-0.15.0-py3-none-any.whl"} <= names
    assert any(n.startswith("ddl-") for n in names) and (out / "constraints.txt").is_file()


def test_a_cuda_torch_from_the_cpu_route_is_refused(tmp_path):
    proc, out = _run(tmp_path, cuda=True)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("build-wheelhouse: torch-2.0.0+cpu-py3-none-any.whl is a CUDA "
                           "build of torch (nvidia-cublas-cu12==12.1.3.1 ...)"), last
    assert not list(out.glob("torch-*.whl"))
