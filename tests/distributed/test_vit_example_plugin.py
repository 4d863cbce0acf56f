"""The ViT example plugin (docs/examples/ddl-vit-plugin) through real `ddl train` runs:
fsdp, tp and pp on 2 processes each end with the weights one process trains, tensor for
tensor (the per-tensor rule: AdamW).

Its model is initialised the timm way (nn.init.trunc_normal_ for the class token, the
positions and every Linear weight), which ddl builds on the meta device under these
layouts and must replay exactly (ddl.worker.build.deferred_init; before issue 49's fix, which
let trunc_normal_ skip meta tensors, all three ended 567 % off one process in
blocks.0.attn.v.weight). Installed as a third party
ships a plugin (a dist-info with the `ddl` entry point `vit` on PYTHONPATH), as
tests/distributed/test_conformance_tp.py installs the GPT example. 4 launches, 2 at a
time: one process, then fsdp, tp and pp; no other check of the kit, to keep CI short (35 s
on the 2-core development machine at load 5).
"""

from __future__ import annotations

import pytest
from conftest import REPO, install_plugin

pytestmark = pytest.mark.distributed

PLUGIN = """
import sys

sys.path.insert(0, {src!r})
from ddl_vit.plugin import ddl_register_workloads  # noqa: E402,F401  (the hook)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("vit-plugin") / "site"
    src = REPO / "docs" / "examples" / "ddl-vit-plugin" / "src"
    return install_plugin(site, "ddl_vit_example", PLUGIN.format(src=str(src)),
                          entry="vit")["PYTHONPATH"]


def test_fsdp_tp_and_pp_train_the_weights_of_one_process(installed, tmp_path, monkeypatch):
    from ddl import conformance
    from ddl.contract.plugins import Plugins

    monkeypatch.syspath_prepend(installed)  # the plugin here and in the `ddl train`s
    monkeypatch.setenv("PYTHONPATH", installed)
    spec = Plugins().workload("vit")
    data_dir = tmp_path / "data"
    spec.create(spec.presets["tiny"]).prepare(data_dir, synthetic=True)
    skipped = conformance.check_strategies("vit", data_dir, tmp_path,
                                           ["fsdp", "tp", "pp"], "tiny",
                                           checks=["strategies"])
    assert skipped == []
