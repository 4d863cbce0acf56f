"""Mixed precision: which dtype the forward pass runs in, and loss scaling for fp16.

``auto`` picks bf16 on GPUs that support it (A100, H100, GH200, MI250X), fp16 with a
gradient scaler on GPUs without bf16 (V100 on CTE-POWER), and fp32 on CPUs. Parameters and
optimizer state stay fp32 (torch.autocast casts per operation), so checkpoints and the
equivalence tests are unaffected by the choice.

fp16 needs loss scaling because small gradients underflow in half precision (Micikevicius
et al., "Mixed Precision Training", ICLR 2018); bf16 has fp32's exponent range and does not.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from ddl.contract.errors import UsageError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve(requested: str, device: torch.device) -> str:
    if requested == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if requested == "fp16" and device.type != "cuda":
        raise UsageError("--precision: fp16 needs a GPU; allowed on CPU: fp32, bf16, auto")
    return requested


@dataclass
class Precision:
    name: str  # fp32, bf16 or fp16
    device: torch.device
    scaler: Any = None

    tf32: bool = False  # fp32 matrix products on tensor cores (CUDA; see allow_tf32)

    @classmethod
    def create(cls, name: str, device: torch.device, tf32: bool = True) -> Precision:
        """The precision ``name`` (fp32, bf16 or fp16) as :func:`resolve` decided it: in the
        pre-flight, once (the run plan's ``resolved.precision``), never again here."""
        if name not in ("fp32", *DTYPES):
            raise ValueError(f"precision {name!r} is not decided; resolve() it first")
        scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
        return cls(name, device, scaler, allow_tf32(device, tf32))

    def autocast(self):
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.name])

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale now (before clipping them); step() then
        does not divide again."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)  # skips the step if gradients overflowed
            self.scaler.update()
        else:
            optimizer.step()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler else {}


def allow_tf32(device: torch.device, wanted: bool) -> bool:
    """``--tf32`` (default on): fp32 matrix products and convolutions on a GPU's tensor
    cores (TF32: fp32's range, a 10-bit mantissa; A100 and newer, about 8x fp32's rate).
    It touches only what runs in fp32: everything under ``--precision fp32``, and under
    bf16/fp16 autocast the few products autocast leaves in fp32. Results then agree with
    full fp32 to about 1e-3 relative per product, not bit for bit; ``--no-tf32`` keeps full
    fp32. CPUs have no TF32: off, whatever was asked. Returns whether it is on."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = wanted
    torch.backends.cudnn.allow_tf32 = wanted
    return wanted
