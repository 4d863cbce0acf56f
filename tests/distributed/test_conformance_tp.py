"""The kit's tensor-parallel check through real `ddl train` runs: a GPT whose
prepare_tensor_parallel does nothing (each rank of 2 then splits its half of the width into
all 4 heads, half as wide: a different model that trains without an error) fails
`strategy:tp` in one line of `ddl check-plugin`, naming a tensor, how far it is from one
process and the hooks to check.

The GPT example (docs/examples/ddl-gpt-plugin) installed as a third party ships a plugin (a
dist-info with a `ddl` entry point on PYTHONPATH). 3 launches: one process, its noise
reference, then tp on 2. The intact GPT passing tp on 2 is checked beside the planted
faults (tests/distributed/test_conformance_faults.py
test_runs_without_a_fault_pass_beside_them, sharing their one-process runs) and in the
whole kit (tests/system/test_gpt_example_plugin.py).
"""

from __future__ import annotations

import pytest
from conftest import REPO, install_plugin

pytestmark = pytest.mark.distributed

PLUGIN = """
import sys
from dataclasses import replace

sys.path.insert(0, {src!r})
from ddl.contract import hookimpl
from ddl_gpt.plugin import ddl_register_workloads as gpt_specs
from ddl_gpt.workload import GptWorkload


class LazyTensorParallel(GptWorkload):
    def prepare_tensor_parallel(self, model, tp_degree):
        pass  # forgets that each rank now holds heads / tp_degree of the heads


@hookimpl
def ddl_register_workloads():
    spec = gpt_specs()[0]
    return [spec, replace(spec, name="lazytp", factory=LazyTensorParallel)]
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("kit-tp") / "site"
    src = REPO / "docs" / "examples" / "ddl-gpt-plugin" / "src"
    return install_plugin(site, "ddl_kit_tp", PLUGIN.format(src=str(src)))["PYTHONPATH"]


def test_do_nothing_tensor_parallel_preparation_fails_in_one_line_naming_the_tensor(
        installed, tmp_path):
    """Through `ddl check-plugin`, as the issue's acceptance asks: one FAIL line."""
    from conftest import run_ddl

    proc = run_ddl("check-plugin", "lazytp", "--strategies", "tp", "--checks", "strategies",
                   "--work-dir", "kit", cwd=tmp_path, env={"PYTHONPATH": installed})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1, proc.stdout
    assert fails[0].startswith("FAIL        strategy:tp: '"), fails[0]
    assert "differs from one process by" in fails[0]
    assert "'blocks.0.attn." in fails[0]  # among the 3 tensors furthest off
    assert "check prepare_tensor_parallel / tp_plan" in fails[0]
    percent = float(fails[0].split("differs from one process by ")[1].split(" %")[0])
    assert percent > 1, fails[0]  # a different model, not rounding
