"""FSDP2's mixed-precision policy (--strategy-option param_dtype / reduce_dtype) takes effect.

Two real 2-process FSDP runs of MNIST tiny from the same seed: fp32 and param_dtype=bf16
(reduce_dtype=fp32). The bf16 run must train (finite, close validation loss), export fp32
weights (the sharded parameters stay fp32), report its policy, and differ from the fp32 run
by bf16 rounding (measured: 0.02-0.11 of a tensor's max after 3 Adam steps): weights equal
to the fp32 run's would mean the policy was never applied.
"""

import json

import pytest
import torch

from conftest import run_ddl

pytestmark = pytest.mark.distributed

COMMON = ["train", "--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "64",
          "--epochs", "1", "--steps-per-epoch", "3", "--seed", "7", "--nproc", "2",
          "--strategy", "fsdp"]


def _train(tmp_path, data_dir, name, *extra):
    run_dir = tmp_path / name
    proc = run_ddl(*COMMON, "--data-dir", str(data_dir), "--run-dir", str(run_dir), *extra,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "model.pt", weights_only=True))


def test_bf16_parameters_with_fp32_reduction(tmp_path, synthetic_mnist):
    fp32, want = _train(tmp_path, synthetic_mnist, "fp32")
    bf16, got = _train(tmp_path, synthetic_mnist, "bf16", "--strategy-option",
                       "param_dtype=bf16", "--strategy-option", "reduce_dtype=fp32")
    assert bf16["strategy_report"] == {"reshard_after_forward": True, "param_dtype": "bf16",
                                       "reduce_dtype": "fp32"}
    assert fp32["strategy_report"]["param_dtype"] == "fp32"
    assert all(t.dtype == torch.float32 for t in got.values())
    relative = {k: float((got[k] - want[k]).abs().max() / want[k].abs().max()) for k in want}
    assert max(relative.values()) > 1e-3, relative  # bf16 compute happened
    assert max(relative.values()) < 0.5, relative  # and is still the same training
    assert bf16["final"]["val"]["loss"] == pytest.approx(fp32["final"]["val"]["loss"], rel=0.02)
