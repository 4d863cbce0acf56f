"""The ddl conformance kit on chargpt, as the plugin's own test suite runs it.

Run it in the environment where the plugin is installed: `python -m pytest tests`.
"""

from ddl import conformance


def test_chargpt_keeps_the_ddl_contract(tmp_path):
    # In-process checks (data, one batch, the hints, pipeline stages keeping the model's
    # names), then one process and every supported strategy through `ddl train`: ddp,
    # fsdp, accelerate, tp, pp, fsdp+tp (4 processes) and the mesh pp=2,tp=2 (4); then
    # HSDP (4), the 3-D mesh (8), tp=4 (4; pp=4 is NOT RUN: tiny has 2 blocks, a warning
    # says so), accumulation, clipping and resume (2 each). AdamW:
    # the per-tensor tolerance rule (tolerance="auto" picks it from the optimizer).
    conformance.check_workload("chargpt", tmp_path)
