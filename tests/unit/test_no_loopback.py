"""A local run where 127.0.0.1 is unreachable (loopback down: a container or namespace
without network) stops in one line at once (issue 42: two processes retried their
rendezvous for 3 minutes and printed ~1000 lines; one got gloo's "Unable to find interface
for 127.0.0.1"). A real network namespace (`unshare -rn`: a new one has `lo` down)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DDL = str(Path(sys.executable).with_name("ddl"))


def _no_network() -> list[str]:
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"no network namespaces here: {probe.stderr.decode().strip()}")
    return ["unshare", "-rn"]


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_run_without_loopback_stops_in_one_line(synthetic_mnist, tmp_path, nproc):
    proc = subprocess.run(
        [*_no_network(), DDL, "train", "--plugin", "mnist", "--preset", "tiny", "--nproc",
         nproc, "--data-dir", str(synthetic_mnist), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ddl: error:")]
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.splitlines()) <= 2, proc.stderr  # the site line, the error
    assert len(errors) == 1 and "127.0.0.1 is unreachable here" in errors[0], proc.stderr
    assert "loopback interface is down" in errors[0] and "Traceback" not in proc.stderr
