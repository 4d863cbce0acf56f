"""An exception in a plugin's code ends the run with one line per failing rank naming the
error and where in the plugin it happened; the whole traceback goes to RUN_DIR/logs/.

The plugin is a real installed distribution as importlib.metadata sees it (dist-info with a
`ddl` entry point on PYTHONPATH): the example workload with a forward that fails the way a
wrong reshape does.
"""

from __future__ import annotations

import pytest

from conftest import REPO, install_plugin, run_ddl

pytestmark = pytest.mark.distributed

PLUGIN = """
import sys
from dataclasses import replace

sys.path.insert(0, {src!r})
from ddl.contract import hookimpl
from ddl_example.plugin import ddl_register_workloads as example_specs
from ddl_example.workload import RegressionWorkload


class BadReshape(RegressionWorkload):
    def forward(self, model, inputs):
        return model(inputs).view(16, 32, 3, 21)  # the wrong shape, as in a GPT attention


@hookimpl
def ddl_register_workloads():
    return [replace(spec, name="badreshape", factory=BadReshape) for spec in example_specs()]
"""


def test_failing_forward_is_one_line_per_rank_with_the_traceback_in_a_file(tmp_path):
    src = REPO / "docs" / "examples" / "ddl-example-plugin" / "src"
    env = install_plugin(tmp_path / "site", "ddl_badreshape", PLUGIN.format(src=str(src)),
                         entry="badreshape")
    data, run_dir = tmp_path / "data", tmp_path / "run"
    prepared = run_ddl("prepare", "--plugin", "badreshape", "--synthetic", "--data-dir",
                       str(data), env=env)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    proc = run_ddl("train", "--plugin", "badreshape", "--preset", "tiny", "--nproc", "2",
                   "--data-dir", str(data), "--run-dir", str(run_dir), env=env, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert 1 <= len(lines) <= 2, proc.stderr
    first = lines[0]
    assert first.startswith("ddl: error on rank "), first
    assert "RuntimeError: shape '[16, 32, 3, 21]' is invalid" in first
    assert "(at ddl_badreshape.py:" in first and "in forward)" in first
    logs = sorted((run_dir / "logs").glob("rank*-traceback.txt"))
    assert logs and "Traceback" in logs[0].read_text()
    assert "view(16, 32, 3, 21)" in logs[0].read_text()
