"""The ViT example plugin (docs/examples/ddl-vit-plugin) trained by ddl's worker: fsdp, tp
and pp on 2 processes each end with the weights one process trains, tensor for tensor (the
conformance kit's per-tensor rule, AdamW, with its noise reference: one process over the
same global batch in 4 micro-batches).

Its model is initialised the timm way (nn.init.trunc_normal_ for the class token, the
positions and every Linear weight), which ddl builds on the meta device under these
layouts and must replay exactly (ddl.worker.build.deferred_init; before issue 49's fix, which
let trunc_normal_ skip meta tensors, all three ended 567 % off one process in
blocks.0.attn.v.weight). Installed as a third party
ships a plugin (a dist-info with the `ddl` entry point `vit` on PYTHONPATH), as
tests/distributed/test_conformance_tp.py installs the GPT example. The runs are the ones
the kit's check_strategies(["fsdp", "tp", "pp"], checks=["strategies"]) makes (the same
flags, 3 steps at seed 7), each the run plan `ddl train` makes trained on a rank pool of 1
or 2 (tests/rankpool.py, pool_train.py) instead of a launch: 5 launches took 88 s of CI on
2 workers, nearly all process start-up. The kit's launches themselves:
tests/distributed/test_conformance_faults.py and test_conformance_tp.py.
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


def test_fsdp_tp_and_pp_train_the_weights_of_one_process(installed, tmp_path, monkeypatch,
                                                         rank_pools):
    from pool_train import prepare, train_cell_with_plugin

    from ddl import conformance
    from ddl.conformance.runs import GLOBAL_BATCH, NOISE_MICROBATCHES
    from ddl.contract.plugins import Plugins

    monkeypatch.syspath_prepend(installed)  # the plugin here (data, run plans)
    spec = Plugins().workload("vit")
    data_dir = tmp_path / "data"
    spec.create(spec.presets["tiny"]).prepare(data_dir, synthetic=True)
    common = ["--plugin", "vit", "--preset", "tiny", "--global-batch-size", str(GLOBAL_BATCH),
              "--data-dir", str(data_dir), *conformance.STEPS]

    def trained(name: str, nproc: int, *args: str) -> dict:
        plan = prepare([*args, *common], tmp_path / name, nproc)
        return rank_pools[nproc].run(train_cell_with_plugin, plan, installed,
                                     ("ddl_vit", "ddl_vit_example"), timeout_s=300)[0]

    one = trained("one-process", 1)
    noise = trained("noise", 1, "--batch-size", str(GLOBAL_BATCH // NOISE_MICROBATCHES))
    for strategy in ("fsdp", "tp", "pp"):
        got = trained(strategy, 2, "--strategy", strategy)
        try:
            conformance.assert_same_weights(got, one, adam=True, noise=noise)
        except AssertionError as exc:
            raise AssertionError(f"{strategy}: {exc}") from None
