"""``meta-build``: does ddl's meta-device build give a model the values a plain build gives?

Every layout that splits the model (FSDP, tensor parallel, pipeline stages, their meshes)
builds it on the meta device and draws each rank's part later (ddl.worker.build.deferred_init).
That must give, bit for bit, what ``build()`` gives in one process with the same seed, or
ddl must refuse it and build the plain way. This check builds the model both ways in this
process, materialises the whole meta model through the same code a rank uses
(ddl.worker.build.materialize.Materializer: ``to_empty``, then every tensor drawn from the
recording), and compares every parameter and buffer; a rank's FSDP or tensor-parallel
shard is a slice of the same values. It also checks that the random generator ends where
a plain build leaves it (the draws after the build, dropout's included, depend on that).

Callable on any model builder, installed or not::

    from ddl import conformance
    report = conformance.check_meta_build(lambda: MyModel(cfg), seed=0)
    assert report.ok, report.summary()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ddl.conformance.contracts import ContractBroken


@dataclass(frozen=True)
class MetaBuildReport:
    """What :func:`check_meta_build` found.

    ``fallback``: why ddl builds this model the plain way (the ``ddl: note:`` a run prints),
    None when it builds on the meta device. ``differing``: names of tensors whose values
    differ from the plain build (empty when exact or when ddl falls back). ``generator``:
    whether the random generator ends where the plain build leaves it. ``checked``: how
    many tensors were compared."""

    fallback: str | None
    differing: tuple[str, ...] = ()
    generator: bool = True
    checked: int = 0

    @property
    def ok(self) -> bool:
        """Every layout starts from one process's weights: exact, or a loud fallback."""
        return self.fallback is not None or (not self.differing and self.generator)

    def summary(self) -> str:
        if self.fallback is not None:
            return f"ddl builds this model the plain way: {self.fallback}"
        if self.ok:
            return (f"{self.checked} tensors bit for bit as a plain build, the random "
                    "generator where a plain build leaves it")
        parts = []
        if self.differing:
            parts.append(f"{len(self.differing)} of {self.checked} tensors differ from a plain "
                         f"build (first: {self.differing[0]})")
        if not self.generator:
            parts.append("the random generator ends elsewhere than after a plain build")
        return "; ".join(parts) + ": layouts that split the model start from other weights"


def check_meta_build(build: Callable[[], Any], seed: int = 0) -> MetaBuildReport:
    """Build with ``build()`` twice from ``seed`` (Python, NumPy and torch seeded as a ddl
    run seeds them): plainly, and on the meta device then materialised; compare."""
    import torch

    from ddl.worker.build import materialize
    from ddl.worker.process.distributed import seed_all
    from ddl.worker.build.model_build import record_or_reason

    seed_all(seed)
    plain = build()
    after_plain = torch.default_generator.get_state()
    values = {materialize.canonical(n): t for n, t in materialize.named_tensors(plain)}
    seed_all(seed)
    recorded = record_or_reason(build)
    if isinstance(recorded, str):
        return MetaBuildReport(fallback=recorded)
    model, recording = recorded
    generator = torch.equal(torch.default_generator.get_state(), after_plain)
    try:
        materialize.Materializer(recording, materialize.refs_of(model, recording),
                                 torch.device("cpu"))(model)
    except RuntimeError as exc:  # a tensor the recording did not make
        return MetaBuildReport(fallback=None, differing=(str(exc),), generator=generator)
    differing, checked = [], 0
    with torch.no_grad():
        for name, tensor in materialize.named_tensors(model):
            name = materialize.canonical(name)
            expected = values.get(name)
            checked += 1
            if expected is None or not _same_bits(expected.detach(), tensor.detach()):
                differing.append(name)
    return MetaBuildReport(fallback=None, differing=tuple(dict.fromkeys(differing)),
                           generator=generator, checked=checked)


def _same_bits(a: Any, b: Any) -> bool:
    """Equal bit for bit (NaN payloads too, which torch.equal calls unequal)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def assert_meta_build(build: Callable[[], Any], name: str, seed: int = 0) -> MetaBuildReport:
    """:func:`check_meta_build`, raising :class:`ContractBroken` (``meta-build``) when the
    meta build silently differs. A fallback passes: the run then builds the plain way."""
    report = check_meta_build(build, seed)
    if not report.ok:
        raise ContractBroken("meta-build", name, report.summary())
    return report
