"""The ViT example plugin (docs/examples/ddl-vit-plugin) passes the conformance kit's
in-process checks: its spec, the generated data, one training batch, its FSDP units,
tensor-parallel plan and pipeline stages (which keep the model's parameter names); it says
in one line that it has no download and which tensor-parallel degrees its heads allow.

Imported from its source directory, not installed (tests/unit/test_deferred_init.py does
the same for the GPT example); the `ddl train` runs are in
tests/distributed/test_vit_example_plugin.py.
"""

from __future__ import annotations

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

SRC = REPO / "docs" / "examples" / "ddl-vit-plugin" / "src"


@pytest.fixture
def vit(monkeypatch):
    monkeypatch.syspath_prepend(str(SRC))
    from ddl_vit.plugin import ddl_register_workloads

    spec = ddl_register_workloads()[0]
    return spec, spec.create(spec.presets["tiny"])


def test_in_process_conformance(vit, tmp_path):
    from ddl import conformance

    spec, _ = vit
    conformance.check_in_process(spec, tmp_path / "data", "tiny")


def test_no_download(vit, tmp_path):
    from ddl.contract.errors import DataError

    _, workload = vit
    with pytest.raises(DataError, match="no download"):
        workload.prepare(tmp_path / "data", synthetic=False)


def test_heads_that_do_not_divide_are_one_usage_error(vit):
    from ddl.contract.errors import UsageError

    _, workload = vit
    model = workload.build_model()
    with pytest.raises(UsageError) as caught:
        workload.prepare_tensor_parallel(model, 3)
    assert str(caught.value) == ("tensor parallel degree 3 does not divide vit's 4 attention "
                                 "heads; allowed: a divisor of the heads")
    workload.prepare_tensor_parallel(model, 2)
    assert {block.attn.heads for block in model.blocks} == {2}
