"""`ddl check-plugin` has a `meta-build` line, and when ddl's meta-device build differs from
a plain build, the FAIL lines of the layouts that build on the meta device say so instead of
naming the workload's hooks (issue 49: a ViT's 12 FAIL lines each blamed another hook).

The meta build is broken for real (a planted fault in ddl's recorder: the redirect of the
initialisers that skip meta tensors switched off, as before issue 49) on a model built with
trunc_normal_. The `ddl train` launches are not run: equivalence_results is replaced by one
that reports a weights mismatch for each run, since only the wording of the lines is under
test here (the launches are tested in tests/distributed and tests/system).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddl.commands import check_plugin
from ddl.commands.cli import main
from ddl.conformance.contracts import ContractBroken
from ddl.worker.build import meta_redirects

pytestmark = pytest.mark.unit


class TruncNormalNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)
        nn.init.trunc_normal_(self.fc.weight, std=0.02)


@pytest.fixture
def mnist_with_a_trunc_normal_model(monkeypatch):
    from ddl_mnist.workload import MnistWorkload

    monkeypatch.setattr(MnistWorkload, "build_model", lambda self: TruncNormalNet())
    # not a test of the data or the forward pass: those in-process checks pass as given
    monkeypatch.setattr("ddl.conformance.check_data",
                        lambda spec, data_dir, preset: spec.create(spec.presets[preset]))
    for name in ("check_datasets", "check_model", "check_hints"):
        monkeypatch.setattr(f"ddl.conformance.{name}", lambda *a, **k: {"train": [0]})
    monkeypatch.setattr("ddl.conformance.check_spec", lambda spec: None)

    def every_run_fails(name, data_dir, work_dir, runs, rule, preset, **kwargs):
        yield None, None
        for run in runs:
            yield run, ContractBroken(f"strategy:{run.label}", name,
                                      "weights differ from one process: fc.weight "
                                      f"(check {run.suspects})")
    monkeypatch.setattr("ddl.conformance.equivalence_results", every_run_fails)


def run(capsys, tmp_path):
    code = main(["check-plugin", "mnist", "--strategies", "ddp", "fsdp", "--checks",
                 "strategies", "--work-dir", str(tmp_path)])
    return code, capsys.readouterr().out.splitlines()


def test_a_differing_meta_build_is_named_as_the_cause(mnist_with_a_trunc_normal_model,
                                                      monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(meta_redirects, "meta_skipping_initialisers", lambda: [])
    code, lines = run(capsys, tmp_path)
    assert code == 1
    build = next(line for line in lines if "meta-build" in line and "strategy" not in line)
    assert build.startswith("FAIL        meta-build: 1 of 2 tensors differ from a plain build "
                            "(first: fc.weight)"), build
    fsdp = next(line for line in lines if line.startswith("FAIL        strategy:fsdp"))
    assert "the cause is the meta-device build, not a hook" in fsdp, fsdp
    ddp = next(line for line in lines if line.startswith("FAIL        strategy:ddp"))
    assert "meta-device build" not in ddp, ddp  # DDP builds the plain way


def test_an_exact_meta_build_passes_and_blames_nothing(mnist_with_a_trunc_normal_model,
                                                       capsys, tmp_path):
    code, lines = run(capsys, tmp_path)
    assert "PASS        meta-build: 2 tensors bit for bit as a plain build, the random " \
           "generator where a plain build leaves it" in lines, lines
    assert not any("meta-device build" in line for line in lines if "strategy:" in line)
    assert code == 1  # the planted run failures still fail


@pytest.mark.parametrize("args, splits", [
    (("--strategy", "ddp"), False), (("--strategy", "accelerate"), False),
    (("--strategy", "fsdp"), True), (("--strategy", "fsdp+tp"), True),
    (("--mesh", "dp_replicate=2"), False), (("--mesh", "dp_replicate=2,dp_shard=2"), True),
    (("--strategy", "ddp", "--mesh", "dp_replicate=2,tp=2"), True),
    (("--strategy", "pp", "--mesh", "pp=2", "--clip-grad-norm", "1"), True),
])
def test_which_kit_runs_build_on_meta(args, splits):
    assert check_plugin._splits_model(args) is splits
    assert torch.get_default_device() == torch.device("cpu")
