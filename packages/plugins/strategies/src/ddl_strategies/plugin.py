"""Registration of the strategies (no torch import here: listing must stay fast)."""

from ddl.contract.hookspecs import hookimpl
from ddl.contract.specs import StrategySpec


@hookimpl
def ddl_register_strategies():
    return [
        StrategySpec(
            name="ddp",
            summary="DistributedDataParallel: full replica per process, gradients all-reduced",
            factory="ddl_strategies.ddp:DDPStrategy",
        ),
        StrategySpec(
            name="fsdp",
            summary="FSDP2 (fully_shard): parameters, gradients and optimizer state sharded "
                    "over the ranks",
            factory="ddl_strategies.fsdp:FSDPStrategy",
        ),
        StrategySpec(
            name="accelerate",
            summary="Hugging Face Accelerate's Accelerator (mode=ddp or mode=fsdp)",
            factory="ddl_strategies.accelerate:AccelerateStrategy",
        ),
        StrategySpec(
            name="pp",
            summary="pipeline parallel (torch.distributed.pipelining): stages over ranks, "
                    "GPipe/1F1B/interleaved schedules",
            factory="ddl_strategies.pp:PipelineStrategy",
            requires=frozenset({"pipeline_splits"}), sync_bn=False,  # ranks hold other layers
        ),
        StrategySpec(
            name="tp",
            summary="tensor parallel (DTensor, Megatron-style column/row splits)",
            factory="ddl_strategies.tp:TensorParallelStrategy",
            requires=frozenset({"tp_plan"}), sync_bn=False,  # dp group < world
        ),
        StrategySpec(
            name="fsdp+tp",
            summary="2-D: FSDP over --mesh dp x tensor parallel over tp",
            factory="ddl_strategies.fsdp_tp:FSDPTensorParallelStrategy",
            requires=frozenset({"tp_plan"}), sync_bn=False,  # dp group < world
        ),
    ]
