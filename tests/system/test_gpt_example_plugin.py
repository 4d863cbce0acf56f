"""The GPT example plugin (docs/examples/ddl-gpt-plugin) as a third party uses it:
installed from its directory into a fresh venv beside ddl (tests/system/plugin_venv.py),
listed by `ddl plugins` with every hint, and passing the conformance kit through its own
test file: one process, then ddp, fsdp, accelerate, tp, pp (2 processes each), fsdp+tp and
`--mesh pp=2,tp=2` (4 each), HSDP and tp=4 (4 each), the 3-D mesh (8), accumulation,
clipping (and its one-process reference) and resume (2 each), every run's final weights
equal to one process's by the per-tensor rule. 16 launches (with the noise reference), 2 at
a time, most of each fresh one process start-up (docs/plugin-authors.md has the measured
cost): all but ddp's are forked from one interpreter that imported ddl, torch and the
plugin (test_example_plugin.py's KIT_FORK; this module 191 -> 82 CPU-s).
"""

from __future__ import annotations

import pytest
from conftest import REPO

from .plugin_venv import install_in_fresh_venv, listed_in_venv_only
from .test_example_plugin import kit_launches, run_kit

pytestmark = pytest.mark.system

GPT = REPO / "docs" / "examples" / "ddl-gpt-plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return install_in_fresh_venv(GPT, tmp_path_factory.mktemp("third-party-gpt"), "ddl_gpt")


def test_listed_with_every_hint_in_the_fresh_venv_only(venv, tmp_path):
    line, listing = listed_in_venv_only(venv, "chargpt", tmp_path)
    assert "small GPT" in line and "ddl-gpt-plugin 0.1.0" in listing


def test_passes_the_conformance_kit_for_every_strategy(venv, tmp_path):
    proc = run_kit(venv, tmp_path / "kit", ["ddl_gpt.plugin", "ddl_gpt.workload",
                                            "ddl_gpt.model"], ("--strategy", "ddp"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    assert kit_launches(proc) == {"forked": 15, "fresh": 1}, proc.stdout[-3000:]
    runs = sorted({p.name for p in (tmp_path / "kit").glob("*/strategy-*")})  # + *current
    assert runs == ["strategy-3-D-pp-2-tp-2-dp-shard-2", "strategy-accelerate",
                    "strategy-accumulation--fsdp", "strategy-clipping--fsdp", "strategy-ddp",
                    "strategy-fsdp", "strategy-fsdp-tp", "strategy-hsdp-dp-replicate-2-dp-shard-2",
                    "strategy-mesh-pp-2-tp-2", "strategy-pp", "strategy-resume--fsdp",
                    "strategy-tp", "strategy-tp-4"], runs  # pp=4: NOT RUN (2 blocks)
