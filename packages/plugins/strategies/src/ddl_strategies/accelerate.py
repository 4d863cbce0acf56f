"""The same runs driven through Hugging Face Accelerate, for users who know its API.

``Accelerator.prepare`` wraps the model the way Accelerate would in a user's own script:
``mode=ddp`` (default) gives torch's DistributedDataParallel, ``mode=fsdp`` FSDP2 through
Accelerate's ``FullyShardedDataParallelPlugin(fsdp_version=2)`` sharding the workload's
FSDP units. The backward pass goes through ``accelerator.backward``. Everything else —
data sharding, learning-rate schedule, metrics, results — is ddl's, so an Accelerate run
is directly comparable with the native strategies (the equivalence test checks it).

Verified on CPU: ``mode=ddp``. ``mode=fsdp`` is written for GPU nodes and refused on CPU,
where Accelerate ignores the FSDP plugin and would train unsharded without saying so.

ddl has already joined the process group; Accelerate detects it and uses it. On CPU,
``Accelerator(cpu=True)`` is required (see the platform notes: ``accelerate launch --cpu``
would silently run one process). Mixed precision stays ddl's ``--precision`` (autocast), so
Accelerate's own is left off rather than applied twice. The ``Accelerator`` belongs to the
run, so it lives on the module ``wrap`` returns (``model.accelerator``), not on the strategy.
"""

from __future__ import annotations

import torch
from torch import nn

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy, StrategyContext


class AccelerateStrategy(Strategy):
    name = "accelerate"
    options_help = {"mode": "ddp (default) or fsdp: which of Accelerate's paths to use"}

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.mode = self.options.get("mode", "ddp")
        if self.mode not in ("ddp", "fsdp"):
            raise UsageError(f"--strategy-option: mode={self.mode!r}; allowed: ddp, fsdp")
        if self.mode == "fsdp":  # the layout records sharding, not replicas
            self.dp_means, self.layout_fill = "dp_shard", ("dp_shard",)

    def check(self, run: StrategyContext) -> None:
        super().check(run)
        if self.mode == "fsdp" and run.world.device.type != "cuda":
            # Accelerate switches to FSDP only for GPU-type worlds; on CPU it would silently
            # train unsharded DDP-style (seen with accelerate 1.15: fsdp_plugin ignored).
            raise UsageError("--strategy-option: accelerate mode=fsdp needs GPUs (Accelerate "
                             "ignores its FSDP plugin on CPU); on CPU use mode=ddp or "
                             "--strategy fsdp")

    def _make_accelerator(self, model: nn.Module, run: StrategyContext):
        from accelerate import Accelerator

        kwargs = {"cpu": run.world.device.type == "cpu", "mixed_precision": "no"}
        if self.mode == "fsdp":
            from accelerate.utils import FullyShardedDataParallelPlugin

            units = run.workload.fsdp_units(model)
            kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
                fsdp_version=2, reshard_after_forward=True,
                auto_wrap_policy="transformer_based_wrap" if units else "no_wrap",
                transformer_cls_names_to_wrap=sorted({type(u).__name__ for u in units}) or None)
        return Accelerator(**kwargs)

    def wrap(self, model: nn.Module, run: StrategyContext) -> nn.Module:
        accelerator = self._make_accelerator(model, run)
        wrapped = accelerator.prepare_model(model)
        wrapped.accelerator = accelerator  # the run's, kept with the model it prepared
        return wrapped

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module
                          ) -> torch.optim.Optimizer:
        return model.accelerator.prepare_optimizer(optimizer)

    def check_accumulation(self, run: StrategyContext, steps: int) -> None:
        raise UsageError(f"--strategy accelerate: --batch-size with --global-batch-size "
                         f"asks for {steps} accumulated micro-steps per optimizer step, which "
                         "ddl does not wire through Accelerate; allowed: the same batch flags "
                         "with --strategy ddp or fsdp, or one of the two flags alone")

    def forward_backward(self, model, batches, run, precision):
        (inputs, targets), = batches  # one micro-batch: check_accumulation refuses more
        with precision.autocast():
            outputs = run.workload.forward(model, inputs)
            loss = run.workload.loss(outputs, targets)
        # fp16: scaled by ddl's scaler, which the trainer's optimizer step unscales
        model.accelerator.backward(precision.scaler.scale(loss) if precision.scaler else loss)
        return loss.detach(), [outputs]

    def clip_gradients(self, model, run, optimizer, precision):
        if not run.clip_grad_norm:
            return None
        precision.unscale(optimizer)
        # Accelerate's own: it knows its wrappers' sharding
        return model.accelerator.clip_grad_norm_(model.parameters(), run.clip_grad_norm)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # DDP's plain module avoids buffer syncs; FSDP must run sharded on every rank.
        return model if self.mode == "fsdp" else model.accelerator.unwrap_model(model)

    def generation_model(self, model: nn.Module, run: StrategyContext) -> nn.Module:
        if self.mode != "fsdp":
            return model  # DDP: the unwrapped module, a full replica
        from ddl_strategies.gathered import gathered_copy

        return gathered_copy(run.workload, model, run.world.device)

    def full_state_dict(self, model: nn.Module, run: StrategyContext
                        ) -> dict[str, torch.Tensor]:
        state = model.accelerator.get_state_dict(model)  # gathers shards under FSDP
        return {k: v.detach().cpu() for k, v in (state or {}).items()}
