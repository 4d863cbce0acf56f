"""The contracts the kit checks, by name, and the failure that names one."""

from __future__ import annotations

CONTRACTS = {
    "presets": "the spec has presets, its default preset is one of them, every preset has "
               "positive epochs, batch size and lr, and a `tiny` preset exists for CPU tests",
    "capabilities": "the spec declares only capabilities ddl knows",
    "data": "prepare(synthetic=True) writes data that check_data() accepts",
    "datasets": "datasets() returns non-empty train, val and test datasets of "
                "(inputs, targets) samples (or samples that to_device() makes pairs of "
                "once batched); every sample len() counts reads and batches "
                "with the first (all of a small split, ends and a random few of a large one)",
    "forward-backward": "a batch runs through forward() and loss() to a finite scalar whose "
                        "backward pass gives finite gradients to the parameters",
    "metrics": "sample_metrics() returns per-sample tensors including `loss`, whose mean "
               "equals loss()",
    "fsdp_units": "a workload declaring fsdp_units returns distinct sub-modules of its model",
    "pipeline_splits": "a workload declaring pipeline_splits cuts its model into stages "
                       "(pipeline_stages(model, 2)) that hold every parameter under the full "
                       "model's name, a weight used by several stages under one name; with "
                       "the default pipeline_stages the splits name top-level children",
    "tp_plan": "a workload declaring tp_plan maps module paths of its model to "
               "'colwise' or 'rowwise'",
    "meta-build": "the model built on the meta device and drawn tensor by tensor (how every "
                  "layout that splits it builds it) equals, bit for bit, the model build_model() "
                  "gives in one process at the same seed, and the random generator ends where "
                  "a plain build leaves it; or ddl refuses the meta build and builds the plain "
                  "way with a note",
    "strategy": "every strategy the workload supports, run by `ddl train` for 3 steps at "
                "its smallest world, and every layout and feature ddl composes (HSDP, the "
                "3-D mesh, tp and pp degrees of 4, accumulation, clipping, resume) end with "
                "the weights one process ends with at the same seed and global batch "
                "(within the tolerance rule)",
}


class ContractBroken(AssertionError):
    """A workload broke a named contract of :data:`CONTRACTS` (``strategy:<label>`` for a
    strategy's run)."""

    def __init__(self, contract: str, workload: str, detail: str) -> None:
        self.contract, self.workload, self.detail = contract, workload, detail
        rule = CONTRACTS[contract.split(":")[0]]
        super().__init__(f"workload {workload!r} breaks contract {contract!r}: {detail} "
                         f"(the contract: {rule})")
