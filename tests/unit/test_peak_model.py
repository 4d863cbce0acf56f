"""The predicted peak's parts beyond model state and activations (ddl.planning.peak_model)
and how ``ddl plan --verify`` compares a peak (ddl.commands.plan_verify.peak_pair)."""

import pytest
import torch

from ddl.commands.plan_verify import peak_pair
from ddl.contract.layout import ParallelLayout
from ddl.planning import peak_model

pytestmark = pytest.mark.unit


class _Adam:
    def optimizer(self, params, lr):
        return torch.optim.AdamW(params, lr=lr)


class _Sgd:
    def optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)


def test_adamw_temporaries_per_tensor_on_cpu_and_foreach_on_gpus():
    # torch's per-tensor AdamW (its CPU default) keeps sqrt(v) and the quotient of one
    # tensor while the previous tensor's quotient is still alive: 3 x the largest tensor;
    # foreach (its GPU default) sqrt(v) of all tensors at once: 1 x their bytes
    cpu = peak_model.optimizer_temporaries(_Adam(), "cpu")
    gpu = peak_model.optimizer_temporaries(_Adam(), "cuda")
    assert cpu == peak_model.TempCost(per_largest=3.0)
    assert gpu == peak_model.TempCost(per_total=1.0)
    assert peak_model.optimizer_temporaries(_Sgd(), "cpu").bytes(10**6, 10**5) == 0


def test_communication_buffers_per_strategy():
    sizes = {"grads_bytes": 1000, "unit_bytes": 100, "boundary_bytes": 7}
    ddp = ParallelLayout(pp=1, dp_replicate=2, dp_shard=1, tp=1)
    fsdp = ParallelLayout(pp=1, dp_replicate=1, dp_shard=4, tp=1)
    pipe = ParallelLayout(pp=2, dp_replicate=1, dp_shard=1, tp=1)
    assert peak_model.comm_buffers(ddp, **sizes) == 1000  # the buckets' copy of the grads
    assert peak_model.comm_buffers(fsdp, **sizes) == 2 * 100 + 100  # gathered + prefetched
    assert peak_model.comm_buffers(fsdp, **sizes, param_itemsize_ratio=0.5) == 100 + 100
    assert peak_model.comm_buffers(pipe, **sizes) == 14


def test_peak_takes_the_larger_of_backward_and_optimizer_step():
    parts = peak_model.peak("cuda", model_state_bytes=1000, activation_bytes=500,
                            largest_kept_bytes=50, optimizer_temp_bytes=300,
                            comm_buffer_bytes=10)
    assert parts.tensors_bytes == 1000 + 10 + 500 + 100
    parts = peak_model.peak("cuda", model_state_bytes=1000, activation_bytes=100,
                            largest_kept_bytes=10, optimizer_temp_bytes=900,
                            comm_buffer_bytes=0)
    assert parts.tensors_bytes == 1900
    assert parts.total_bytes == (peak_model.GPU_RUNTIME_BYTES["cuda"] + 1900
                                 + round(peak_model.GPU_SLACK * 1900))


def test_verify_compares_a_cpu_peak_above_the_process_baseline():
    parts = peak_model.peak("cpu", model_state_bytes=10, activation_bytes=20,
                            largest_kept_bytes=1, optimizer_temp_bytes=0,
                            comm_buffer_bytes=0).as_dict()
    predicted = {"memory_per_rank_bytes": parts["total_bytes"], "peak": parts}
    measured = {"peak_source": "peak_rss_bytes", "peak_bytes": 900 * 2**20,
                "peak_above_baseline_bytes": 40 * 2**20}
    assert peak_pair(predicted, measured) == (parts["total_bytes"] - parts["interpreter_bytes"],
                                              40 * 2**20)
    gpu = {"peak_source": "device_peak_allocated_bytes", "peak_bytes": 77}
    assert peak_pair(predicted, gpu) == (parts["tensors_bytes"], 77)
    assert peak_pair({"memory_per_rank_bytes": 5}, measured) == (5, 900 * 2**20)


def test_a_cpu_rank_under_fsdp2_pays_its_runtime_per_unit():
    """FSDP2's per-unit runtime on a CPU rank (CPU_FSDP_UNIT_BYTES, measured): added per
    unit held, on CPUs only (a GPU's runtime is the assumed context + NCCL buffers)."""
    kwargs = dict(model_state_bytes=10, activation_bytes=20, largest_kept_bytes=1,
                  optimizer_temp_bytes=0, comm_buffer_bytes=0)
    plain = peak_model.peak("cpu", **kwargs)
    three = peak_model.peak("cpu", fsdp_units=3, **kwargs)
    assert three.total_bytes - plain.total_bytes == 3 * peak_model.CPU_FSDP_UNIT_BYTES
    assert three.tensors_bytes == plain.tensors_bytes  # not a tensor: no slack on it
    assert peak_model.peak("cuda", fsdp_units=3, **kwargs).total_bytes == \
        peak_model.peak("cuda", **kwargs).total_bytes
