"""Exact or loud: every init pattern a third-party model uses either replays bit for bit on
the meta device (ddl.worker.build.deferred_init) or is refused with a reason that names the tensor
or the place in the build, so the run builds the plain way with one note. Each pattern here
gave other values than a plain build, silently, before issue 49 (torch 2.14's
trunc_normal_, orthogonal_, dirac_ and sparse_ return early on a meta tensor; a reseed or a
CPU draw inside the build, a draw between the build and the first materialisation, and a
dtype-reinterpreting view were not seen)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.init import trunc_normal_ as imported_trunc_normal_

from ddl import conformance
from ddl.worker.build import deferred_init, materialize, meta_redirects
from ddl.worker.build.model_build import record_or_reason

pytestmark = pytest.mark.unit


def P(*shape) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


def plain_and_meta(build, seed=0):
    """(plain model, its generator state after, meta values by name, generator after)."""
    torch.manual_seed(seed)
    plain = build()
    after_plain = torch.default_generator.get_state()
    torch.manual_seed(seed)
    model, recording = deferred_init.record(build)
    after_meta = torch.default_generator.get_state()
    values = {}
    for name, tensor in materialize.named_tensors(model):
        ref = recording.ref(tensor)
        values[name] = ref.view_of(recording.value(ref.storage))
    return plain, after_plain, values, after_meta


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN payloads too, which torch.equal calls unequal)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def assert_exact(build):
    plain, after_plain, values, after_meta = plain_and_meta(build)
    expected = dict(materialize.named_tensors(plain))
    assert values.keys() == expected.keys()
    for name, value in values.items():
        assert same_bits(value, expected[name].detach()), name
    assert torch.equal(after_meta, after_plain), "generator not where a plain build leaves it"


class TimmBlock(nn.Module):
    """Initialised as timm's ViT is: Linear weights re-drawn by trunc_normal_ over what
    nn.Linear's own reset drew (so an empty-only check alone would not see a skip)."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.zeros(1, 1, 8))
        self.pos = nn.Parameter(torch.zeros(1, 5, 8))
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)
        nn.init.trunc_normal_(self.cls, std=0.02)
        imported_trunc_normal_(self.pos, std=0.02)  # the `from ... import` alias
        for layer in (self.fc, self.out):
            nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)


@pytest.mark.parametrize("build", [
    pytest.param(lambda: nn.ParameterList([nn.init.trunc_normal_(P(4), std=.02),
                                           nn.init.normal_(P(3))]), id="trunc_normal_"),
    pytest.param(lambda: nn.ParameterList([nn.init.trunc_normal_(P(64), a=0.5, b=3.0),
                                           nn.init.normal_(P(3))]),
                 id="trunc_normal_-narrow-interval"),  # the other branch: rejection sampling
    pytest.param(TimmBlock, id="trunc_normal_-over-linear-reset"),
    pytest.param(lambda: nn.ParameterList([nn.init.orthogonal_(P(4, 6)),
                                           nn.init.orthogonal_(P(6, 3), gain=2.0),
                                           nn.init.normal_(P(3))]), id="orthogonal_"),
    pytest.param(lambda: nn.ParameterList([nn.init.dirac_(P(4, 2, 3, 3), groups=2)]),
                 id="dirac_"),
    pytest.param(lambda: nn.Conv2d(2, 4, 3).apply(
        lambda m: nn.init.dirac_(m.weight) if isinstance(m, nn.Conv2d) else None),
                 id="dirac_-over-conv-reset"),
    pytest.param(lambda: nn.ParameterList([nn.init.sparse_(P(5, 3), 0.4),
                                           nn.init.normal_(P(3))]), id="sparse_"),
    pytest.param(lambda: nn.ParameterList([nn.init.orthogonal_(P(8, 4)[2:6])]),
                 id="orthogonal_-on-a-view"),
])
def test_initialisers_that_skip_meta_tensors_replay_exactly(build):
    assert_exact(build)


def _example_args(name: str):
    """A tensor and arguments each public torch.nn.init initialiser accepts."""
    shapes = {"dirac_": (4, 2, 3, 3), "eye_": (3, 5)}
    extra = {"constant_": (0.3,), "sparse_": (0.5,)}
    return torch.empty(*shapes.get(name, (4, 6))), extra.get(name, ())


INITIALISERS = sorted(name for name, f in vars(nn.init).items()
                      if inspect.isfunction(f) and name.endswith("_") and not name.startswith("_")
                      and f.__module__ == nn.init.__name__)


@pytest.mark.parametrize("name", INITIALISERS)
def test_every_torch_initialiser_replays_exactly(name):
    """Any initialiser of torch.nn.init, including ones a later torch teaches to skip
    meta tensors: bit for bit, with the generator where a plain build leaves it."""
    def build():
        tensor, args = _example_args(name)
        first = P(3).data.normal_()  # a draw before, to see any shift in the stream
        param = nn.Parameter(tensor)
        getattr(nn.init, name)(param, *args)
        return nn.ParameterList([nn.Parameter(first), param, nn.init.normal_(P(2))])
    assert_exact(build)


def test_the_redirect_covers_what_torch_skips_and_is_undone():
    skipping = {f.__name__ for f in meta_redirects.meta_skipping_initialisers()}
    assert {"_no_grad_trunc_normal_", "orthogonal_", "dirac_", "sparse_"} <= skipping
    codes = {f: f.__code__ for f in meta_redirects.meta_skipping_initialisers()}
    with pytest.raises(deferred_init.NotReplayable):
        deferred_init.record(lambda: torch.manual_seed(1))
    deferred_init.record(TimmBlock)
    assert all(f.__code__ is code for f, code in codes.items())
    # (importing torch._dynamo replaces torch.manual_seed by a wrapper of torch.random's)
    assert all(f.__code__.co_name == f.__name__ for f in meta_redirects.SEEDING)
    meta = torch.empty(3, device="meta")
    assert nn.init.trunc_normal_(meta) is meta  # outside a recording: torch's own, a no-op


def test_a_reference_held_in_a_dict_is_redirected_too():
    """transformers keeps torch's initialisers in a dict made at import time
    (transformers.initialization.TORCH_INIT_FUNCTIONS); they must still replay."""
    held = {"trunc_normal_": nn.init.trunc_normal_, "orthogonal_": nn.init.orthogonal_}
    assert_exact(lambda: nn.ParameterList([held["trunc_normal_"](P(5), std=.1),
                                           held["orthogonal_"](P(3, 3))]))


@pytest.mark.parametrize("build, says", [
    (lambda: nn.Sequential(nn.Linear(2, 2), _seed(5), nn.Linear(2, 2)),
     "torch.manual_seed is called during the build at test_meta_build_patterns.py:"),
    (lambda: nn.Sequential(nn.Linear(2, 2), _call(torch.seed)),
     "torch.seed is called during the build"),
    (lambda: nn.Sequential(nn.Linear(2, 2), _call(lambda: torch.set_rng_state(
        torch.get_rng_state()))), "torch.set_rng_state is called during the build"),
    (lambda: nn.Sequential(nn.Linear(5, 2), _buffer(lambda: torch.randperm(5, device="cpu"))),
     "randperm draws on a real CPU tensor during the build at test_meta_build_patterns.py:"),
    (lambda: nn.Sequential(nn.Linear(5, 2), _buffer(lambda: torch.zeros(3, device="cpu")
                                                    .uniform_())),
     "uniform_ draws on a real CPU tensor during the build"),
    (lambda: nn.ParameterList([nn.init.trunc_normal_(P(4), generator=torch.Generator())]),
     "_no_grad_trunc_normal_ uses its own random generator"),
    (lambda: nn.ParameterList([P(4)]), "0 keeps the values of torch.empty"),
    (lambda: nn.Sequential(nn.Linear(2, 2), _buffer(lambda: torch.empty(3))),
     "1.kept keeps the values of torch.empty"),
    (lambda: nn.Sequential(nn.Linear(2, 2), _buffer(lambda: torch.from_numpy(
        np.arange(3.0)))), "1.kept is a real cpu tensor made during the build"),
])
def test_what_cannot_replay_is_refused_by_name(build, says):
    state = torch.default_generator.get_state()
    with pytest.raises(deferred_init.NotReplayable) as caught:
        deferred_init.record(build)
    assert says in str(caught.value), str(caught.value)
    assert torch.equal(torch.default_generator.get_state(), state)  # left as it was
    reason = record_or_reason(build)  # what the run's note says
    assert isinstance(reason, str) and says in reason


class _Holder(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.register_buffer("kept", make())


def _buffer(make):
    return _Holder(make)


def _seed(seed):
    torch.manual_seed(seed)
    return nn.Identity()


def _call(function):
    function()
    return nn.Identity()


def test_a_seeded_generator_of_its_own_outside_the_build_is_fine():
    """A CPU draw from an explicit generator does not touch the default stream (on a meta
    tensor an explicit generator is refused: ddl does not replay other generators)."""
    def build():
        mine = torch.Generator().manual_seed(3)
        order = torch.randperm(4, generator=mine, device="cpu")
        holder = _Holder(lambda: torch.zeros(4).copy_(order))  # a meta copy of a constant
        return nn.Sequential(nn.Linear(4, 2), holder)
    assert_exact(build)


def test_draws_between_the_build_and_materialising_stay_as_a_plain_build_has_them():
    build = lambda: nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))  # noqa: E731
    torch.manual_seed(2)
    plain = build()
    plain_between = torch.rand(4)  # e.g. a strategy drawing before the first part
    plain_after = torch.rand(2)
    torch.manual_seed(2)
    model, recording = deferred_init.record(build)
    between = torch.rand(4)
    materialize.Materializer(recording, materialize.refs_of(model, recording),
                             torch.device("cpu"))(model)
    assert torch.equal(between, plain_between)
    for (name, got), (_, want) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(got, want), name
    assert torch.equal(torch.rand(2), plain_after)  # materialising left the stream alone


def test_a_dtype_reinterpreting_view_replays_with_its_dtype():
    def build():
        layer = nn.Linear(2, 2)
        bits = torch.zeros(4)
        bits.view(torch.int32).fill_(7)
        bits[2:].view(torch.int16).fill_(-3)
        layer.register_buffer("bits", bits)
        return layer
    assert_exact(build)


def test_the_conformance_check_finds_a_silent_difference(monkeypatch):
    """The kit's meta-build check fails a build the recorder gets wrong: here the redirect
    is switched off, which is what ddl did before issue 49."""
    monkeypatch.setattr(meta_redirects, "meta_skipping_initialisers", lambda: [])
    report = conformance.check_meta_build(TimmBlock)
    assert not report.ok and report.fallback is None
    assert set(report.differing) == {"cls", "pos", "fc.weight", "out.weight"}
    assert "4 of 6 tensors differ from a plain build (first: cls)" in report.summary()
    with pytest.raises(conformance.ContractBroken, match="meta-build"):
        conformance.assert_meta_build(TimmBlock, "timm-block")
    monkeypatch.undo()
    assert conformance.check_meta_build(TimmBlock).ok


def test_the_conformance_check_reports_a_fallback_with_its_reason():
    report = conformance.check_meta_build(lambda: nn.Sequential(nn.Linear(2, 2), _seed(1)))
    assert report.ok and report.fallback is not None
    assert report.summary().startswith("ddl builds this model the plain way: torch.manual_seed")
