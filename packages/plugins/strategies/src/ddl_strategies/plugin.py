"""Registration of the strategies (no torch import here: listing must stay fast)."""

from ddl.contract.hookspecs import hookimpl
from ddl.contract.specs import StrategySpec

CONTRACT = "2"  # ddl.contract.CONTRACT_VERSION's major these strategies target

# The --strategy-option keys of each class (its options_help), named here without torch so
# that `ddl submit` can check them before the queue (tests/unit/test_submit_preflight.py).
DDP = frozenset({"bucket_cap_mb"})
FSDP = frozenset({"reshard_after_forward", "param_dtype", "reduce_dtype", "generation"})
PIPELINE = frozenset({"schedule", "stages_per_rank", "bubble_steps"})


@hookimpl
def ddl_register_strategies():
    return [
        StrategySpec(
            contract=CONTRACT,
            name="mesh",
            summary="any layout from --mesh (pp, dp_replicate, dp_shard, tp): pipeline, then "
                    "tensor parallel, then FSDP/HSDP (DDP when only replicating); what "
                    "`ddl train --mesh ...` uses without --strategy",
            factory="ddl_strategies.compose:MeshStrategy", options=DDP | FSDP | PIPELINE,
            sync_bn=False,  # data-parallel groups are slices of the world
        ),
        StrategySpec(
            contract=CONTRACT,
            name="ddp",
            summary="DistributedDataParallel: full replica per process, gradients all-reduced",
            factory="ddl_strategies.shorthands:DDP", options=DDP,
        ),
        StrategySpec(
            contract=CONTRACT,
            name="fsdp",
            summary="FSDP2 (fully_shard): parameters, gradients and optimizer state sharded "
                    "over the ranks",
            factory="ddl_strategies.shorthands:FSDP", options=FSDP,
        ),
        StrategySpec(
            contract=CONTRACT,
            name="accelerate",
            summary="Hugging Face Accelerate's Accelerator (mode=ddp or mode=fsdp)",
            factory="ddl_strategies.accelerate:AccelerateStrategy",
            imports=("accelerate",), install="ddl-strategies[accelerate]",
            options=frozenset({"mode"}),
        ),
        StrategySpec(
            contract=CONTRACT,
            name="pp",
            summary="pipeline parallel (torch.distributed.pipelining): stages over ranks, "
                    "GPipe/1F1B/interleaved schedules",
            factory="ddl_strategies.shorthands:Pipeline", options=PIPELINE,
            requires=frozenset({"pipeline_splits"}), sync_bn=False,  # ranks hold other layers
        ),
        StrategySpec(
            contract=CONTRACT,
            name="tp",
            summary="tensor parallel (DTensor, Megatron-style column/row splits)",
            factory="ddl_strategies.shorthands:TensorParallel", options=frozenset(),
            requires=frozenset({"tp_plan"}), sync_bn=False,  # dp group < world
        ),
        StrategySpec(
            contract=CONTRACT,
            name="fsdp+tp",
            summary="2-D: FSDP over --mesh dp x tensor parallel over tp (default tp=2)",
            factory="ddl_strategies.shorthands:FSDPTensorParallel", options=FSDP,
            requires=frozenset({"tp_plan"}), sync_bn=False,  # dp group < world
        ),
    ]
