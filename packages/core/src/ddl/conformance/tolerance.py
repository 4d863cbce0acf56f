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

The constants above were measured on one CPU; another rounds differently (issue 52: three
pipeline cells of the xresnet ended 8.4e-6 from one process against a bound of 8.1e-6 on
an Intel Xeon). So a comparison may also take a *noise reference*: the same model trained
in one process with an equivalent but differently ordered computation (the same global
batch in 2 micro-batches of half the size: the same mean gradient, other summation order).
How far it ends from one process is the reduction-order noise of this model, on this CPU,
for this many steps, per tensor. A tensor's bound is then the rule's, raised to
``NOISE_FACTOR`` times that tensor's measured noise (``||noise - one process||``; the
elementwise rule: its largest element), but never above ``NOISE_CAP`` times the rule's
own bound: the noise run shares ddl's accumulation code with the runs under test, and the
cap keeps a broken accumulation from excusing itself. Planted faults (a tensor-parallel
plan that does nothing, replicas that never average, a forgotten stage) end 1e-3 or more
off, far above any capped bound. ``NOISE_FACTOR`` 4: a 2-rank or 4-stage run reorders at
least as many sums as 2 micro-batches do (the same additions, other groupings), and 4
covers the spread between tensors of one model measured here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOISE_FACTOR = 4.0  # a tensor's bound: at least this times its measured noise ...
NOISE_CAP = 10.0  # ... but at most this times the rule's own bound (module docstring)


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

    def mismatch(self, name: str, got: Any, want: Any, noise: Any = None) -> str | None:
        """Why ``got`` is not ``want`` under this rule, or None when it is. ``noise``: the
        tensor from a noise reference run (module docstring), which may raise the bound."""
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
        floor = None
        if noise is not None and noise.shape == want.shape:
            off = noise.double() - want.double()
            if torch.isfinite(off).all() and off.numel():
                floor = float(off.norm() if self.per_tensor else off.abs().max())
        if self.per_tensor:
            bound = self.rtol * float(want.double().norm()) + atol * want.numel() ** 0.5
            bound, said = _raised(bound, floor)
            if float(diff.norm()) > bound or worst >= self.max_element:
                return (f"||diff|| {float(diff.norm()):.3g} (bound {bound:.3g}{said}), "
                        f"worst element {worst:.3g}")
            return None
        allowed = atol + self.rtol * want.double().abs()
        if floor is not None:
            allowed = torch.clamp(allowed, min=min(NOISE_FACTOR * floor,
                                                   NOISE_CAP * float(allowed.max())))
        if (diff.abs() > allowed).any():
            said = f"; measured noise {floor:.3g}" if floor is not None else ""
            return f"worst element off by {worst:.3g}{said}"
        return None


def _raised(bound: float, floor: float | None) -> tuple[float, str]:
    """The per-tensor bound raised by a measured noise floor (capped), and how to say so."""
    if floor is None:
        return bound, ""
    raised = min(max(bound, NOISE_FACTOR * floor), NOISE_CAP * bound)
    return raised, f"; rule {bound:.3g}, measured noise {floor:.3g}"


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


def mismatches(got: dict, want: dict, tolerance: Tolerance, noise: dict | None = None
               ) -> list[tuple[str, str]]:
    """(tensor name, why) for every tensor of ``want`` that ``got`` does not match;
    ``noise``: a noise reference run's weights (module docstring)."""
    noise = noise or {}
    return [(name, why) for name, expected in want.items()
            if (why := tolerance.mismatch(name, got[name], expected, noise.get(name)))
            is not None]


def assert_same_weights(got: dict, want: dict, *, adam: bool = False,
                        noise: dict | None = None) -> None:
    """The rule ddl's own equivalence tests apply (per-tensor for AdamW-trained models):
    an AssertionError naming the first tensor that differs. ``noise``: the weights of a
    noise reference run, whose distance from ``want`` may raise each tensor's bound."""
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    rule = TOLERANCES["per-tensor" if adam else "elementwise"]
    wrong = mismatches(got, want, rule, noise)
    assert not wrong, f"{wrong[0][0]}: {wrong[0][1]} ({rule.describe()})"
