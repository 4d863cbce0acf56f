"""The ddl conformance kit on vit, as the plugin's own test suite runs it.

Run it in the environment where the plugin is installed: `python -m pytest tests`.
"""

from ddl import conformance


def test_vit_keeps_the_ddl_contract(tmp_path):
    # In-process checks (data, one batch, the hints, pipeline stages keeping the model's
    # names), then one process and every supported strategy through `ddl train`: ddp,
    # fsdp, accelerate, tp, pp, fsdp+tp (4 processes) and the mesh pp=2,tp=2 (4); then
    # HSDP (4), the 3-D mesh (8), tp=4 and pp=4 (4 each: tiny has 4 heads and 4 blocks),
    # accumulation, clipping and resume (2 each). AdamW: the per-tensor tolerance rule
    # (tolerance="auto" picks it from the optimizer).
    conformance.check_workload("vit", tmp_path)
