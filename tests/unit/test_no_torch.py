"""The fast paths of the CLI must not import torch (it costs seconds on every call)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import sys
from ddl.commands.cli import main
try:
    code = main({args!r})
except SystemExit as exc:  # argparse's --help exits
    code = exc.code
heavy = sorted(m for m in ("torch", "torchvision", "transformers", "numpy") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
sys.exit(code or 0)
"""


@pytest.mark.parametrize("args", [
    ["--help"], ["plugins"], ["sites"], ["sites", "show", "lumi-g"], ["train", "--help"],
    ["prepare", "--help"], ["check-plugin", "--help"], ["submit", "--help"], ["watch", "--help"], ["layout", "--mesh", "pp=2,tp=2,dp_shard=2"],
    ["submit", "--site", "juwels-booster", "--nodes", "2", "--dry-run", "--plugin", "mnist"],
    # the tensor-parallel check against the model's heads (issue 52) reads the preset
    ["submit", "--site", "juwels-booster", "--nodes", "2", "--dry-run", "--plugin", "xsum",
     "--preset", "tiny", "--mesh", "tp=4"],
])
def test_command_does_not_import_torch(args):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY:\n" in proc.stdout or proc.stdout.rstrip().endswith("HEAVY:"), proc.stdout


def test_probe_detects_torch():
    """The probe itself can fail: it reports torch once something imported it."""
    probe = PROBE.replace("from ddl.commands.cli import main", "from ddl.commands.cli import main\nimport torch")
    proc = subprocess.run([sys.executable, "-c", probe.format(args=["sites"])],
                          capture_output=True, text=True, timeout=60)
    heavy = proc.stdout.rsplit("HEAVY:", 1)[1].split()[0].split(",")
    assert "torch" in heavy


@pytest.mark.parametrize("args, flag", [
    (["train", "--plugin", "cifar99"], "--plugin"),
    (["train", "--plugin", "mnist", "--preset", "huge"], "--preset"),
    (["train", "--plugin", "xsum", "--strategy", "mesh", "--mesh", "tp=2", "--preset", "x"],
     "--preset"),
    (["train", "--plugin", "mnist", "--data-dir", "/nonexistent/ddl-data"], "--data-dir"),
])
def test_a_misspelt_name_or_missing_data_is_refused_before_torch_loads(args, flag):
    """Unknown plugin or preset, a --data-dir that is not there: the one line and exit 2
    come before the pre-flight imports torch (0.2 s instead of 2.5 s). Outside any Slurm
    job: a task other than the first would leave the line to the first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"ddl: error: {flag}"), proc.stderr
    assert proc.stdout.rstrip().endswith("HEAVY:"), proc.stdout
