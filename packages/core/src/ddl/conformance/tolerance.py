"""Named rules for "the same weights": how far a parallel run may end from one process.

Gradients averaged over N replicas of B/N samples equal one B-sample gradient up to the
order of float additions, so a correct strategy ends within rounding of one process. How far
rounding travels depends on the optimizer:

- ``elementwise`` (SGD-like optimizers): every element within ``rtol`` relative with an
  absolute floor ``atol``; an update is the gradient times the lr, so rounding stays rounding.
- ``per-tensor`` (Adam, AdamW and other adaptive optimizers; ddl's own equivalence tests
  use it): ``||got - want|| <= rtol ||want|| + atol sqrt(numel)`` per tensor, and no element
  off by more than ``max_element``. Adam divides each update by the gradient's running
  magnitude, so for the few weights whose gradient is ~0 another summation order changes
  the update by a visible fraction of a step: measured in ddl's tests, 7-10 of T5-tiny's
  390k elements differed by 1e-5 to 3e-5 while every tensor agreed to 1e-6 to 3e-6.

BatchNorm running statistics (names with ``running_``), averages of nearly cancelling
activations, get an absolute floor of 1e-5; integer tensors must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    name: str
    per_tensor: bool
    rtol: float = 1e-5
    atol: float = 1e-6
    max_element: float = 1e-4  # per-tensor rule only
    atol_running_stats: float = 1e-5

    def describe(self) -> str:
        if self.per_tensor:
            return (f"{self.name} rule: ||diff|| <= {self.rtol:g} ||one process|| + "
                    f"{self.atol:g} sqrt(numel), no element off by {self.max_element:g}")
        return f"{self.name} rule: every element within {self.rtol:g} relative, {self.atol:g} absolute"

    def mismatch(self, name: str, got: Any, want: Any) -> str | None:
        """Why ``got`` is not ``want`` under this rule, or None when it is."""
        import torch

        if got.shape != want.shape:
            return f"shape {tuple(got.shape)}, one process {tuple(want.shape)}"
        if not torch.is_floating_point(want):
            return None if torch.equal(got, want) else "integer values differ"
        atol = self.atol_running_stats if "running_" in name else self.atol
        diff = got.double() - want.double()
        if not torch.isfinite(diff).all():
            return "non-finite values"
        worst = float(diff.abs().max()) if diff.numel() else 0.0
        if self.per_tensor:
            bound = self.rtol * float(want.double().norm()) + atol * want.numel() ** 0.5
            if float(diff.norm()) > bound or worst >= self.max_element:
                return f"||diff|| {float(diff.norm()):.3g} (bound {bound:.3g}), worst element {worst:.3g}"
            return None
        allowed = atol + self.rtol * want.double().abs()
        if (diff.abs() > allowed).any():
            return f"worst element off by {worst:.3g}"
        return None


TOLERANCES = {
    "elementwise": Tolerance("elementwise", per_tensor=False),
    "per-tensor": Tolerance("per-tensor", per_tensor=True),
}
#: Optimizers whose steps are the gradient times the lr (the elementwise rule suits them).
SGD_LIKE = ("SGD",)


def relative_difference(got: Any, want: Any) -> float:
    """||got - want|| / ||want|| (the size of a mismatch in a failure message)."""
    want = want.double()
    return float((got.double() - want).norm()) / max(float(want.norm()), 1e-30)


def tolerance_for(rule: str | Tolerance, optimizer: Any = None) -> Tolerance:
    """The rule named ``rule`` (``auto``: elementwise for an SGD-like ``optimizer``,
    per-tensor for any other)."""
    from ddl.contract.errors import UsageError

    if isinstance(rule, Tolerance):
        return rule
    if rule == "auto":
        sgd_like = type(optimizer).__name__ in SGD_LIKE
        return TOLERANCES["elementwise" if sgd_like else "per-tensor"]
    if rule not in TOLERANCES:
        raise UsageError(f"tolerance: unknown rule {rule!r}; allowed: auto, "
                         f"{', '.join(TOLERANCES)} or a Tolerance")
    return TOLERANCES[rule]


def mismatches(got: dict, want: dict, tolerance: Tolerance) -> list[tuple[str, str]]:
    """(tensor name, why) for every tensor of ``want`` that ``got`` does not match."""
    return [(name, why) for name, expected in want.items()
            if (why := tolerance.mismatch(name, got[name], expected)) is not None]


def assert_same_weights(got: dict, want: dict, *, adam: bool = False) -> None:
    """The rule ddl's own equivalence tests apply (per-tensor for AdamW-trained models):
    an AssertionError naming the first tensor that differs."""
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    rule = TOLERANCES["per-tensor" if adam else "elementwise"]
    wrong = mismatches(got, want, rule)
    assert not wrong, f"{wrong[0][0]}: {wrong[0][1]} ({rule.describe()})"
