"""`ddl plan --precision`: a run under bf16 autocast keeps 16-bit activations, and the plan
predicts them (ddl.planning.autocast_probe: the probe runs on fake tensors under torch's own
autocast). Checked against real runs on 2 CPU processes through `--verify`: the runs train
with `--precision bf16` and ddl's saved-tensor meter measures what they held; MNIST and
Imagewoof (convolutions, BatchNorm, linear layers) within the acceptance's 15 %, below the
fp32 prediction. The CUDA policy runs here only on fake CUDA tensors (no GPU): its numbers
are checked to be 16-bit ones, not against a GPU run (the GPU kit records that)."""

import json

import pytest

from conftest import run_ddl

pytestmark = pytest.mark.distributed


def _plan(tmp_path, plugin, data, *flags):
    proc = run_ddl("plan", "--plugin", plugin, "--preset", "tiny", "--data-dir", str(data),
                   "--format", "json", "--top", "1", *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("plugin", ["mnist", "imagewoof"])
def test_bf16_runs_hold_what_the_plan_predicts(plugin, tmp_path, request):
    data = request.getfixturevalue(f"synthetic_{plugin}")
    # Imagewoof at a global batch of 16, not its preset's 64 (2 x 32): its two plans time
    # the workload and the verify run trains 2 x 10 steps, the largest share of this
    # module's CPU. 8 samples a rank still keep bf16 at 0.65x the fp32 prediction (0.55x at
    # 32 a rank; 0.78x at 4, too near the bar) and the run within 0.2 % of the plan
    # (2026-11-30).
    batch = ("--global-batch-size", "16") if plugin == "imagewoof" else ()
    local = ("--site", "local", "--nproc", "2", *batch)
    fp32 = _plan(tmp_path, plugin, data, *local)
    report = _plan(tmp_path, plugin, data, *local, "--precision", "bf16", "--verify", "1")
    assert (fp32["computes_in"], report["computes_in"]) == ("fp32", "bf16")
    [row] = report["verify"]["layouts"]
    assert row["status"] == "measured", row
    predicted, measured = row["predicted"], row["measured"]
    assert measured["activation_bytes"] == pytest.approx(predicted["activation_bytes"],
                                                         rel=0.15)
    same = next(r for r in fp32["fits"] if r["flags"] == row["flags"])
    assert predicted["activation_bytes"] < 0.8 * same["activation_bytes"]


def test_auto_is_16_bit_on_a_gpu_site_and_fp32_on_a_cpu(tmp_path, synthetic_mnist):
    gpu = ("--site", "juwels", "--nproc", "1", "--global-batch-size", "32")
    auto, fp32 = (_plan(tmp_path, "mnist", synthetic_mnist, *gpu, *extra)
                  for extra in ((), ("--precision", "fp32")))
    assert (auto["computes_in"], fp32["computes_in"]) == ("bf16", "fp32")
    # on fake CUDA tensors: CUDA's autocast computes the convolutions and the linear layer
    # in bf16, so less than three quarters of fp32's bytes are kept
    assert auto["fits"][0]["activation_bytes"] < 0.75 * fp32["fits"][0]["activation_bytes"]
    cpu = _plan(tmp_path, "mnist", synthetic_mnist, "--site", "local", "--nproc", "1",
                "--global-batch-size", "32")
    assert cpu["computes_in"] == "fp32"
    assert cpu["fits"][0]["activation_bytes"] == fp32["fits"][0]["activation_bytes"]


def test_16_bit_plans_of_every_split_on_a_gpu_site(tmp_path, synthetic_xsum):
    """T5 on fake CUDA tensors under CUDA's autocast, for every kind of layout the plan
    makes (tensor parallel narrows the layers, pipelines cut stages, FSDP shards): each
    layout's activations differ from its fp32 figure (autocast ran), none of them dropped
    for an error. Not always less: the bf16 copies of the weights autocast saves for
    backward are a fixed part on top, which the tiny T5's small per-sample saving (2 %)
    does not always outweigh (17.35 MB against 17.14 MB for dp_replicate=4). A pipeline
    rank's fullest stage at 2 or 4 samples per micro-batch comes out equal to the byte
    (3,030,848 B in both precisions, 2026-11-29, once attention was probed with the
    kernel the run uses): a part that does not grow with the batch decides there. So per
    kind of split its largest micro-batch must differ, and at least half its rows."""
    site = ("--site", "juwels", "--nodes", "1", "--top", "1000")
    auto, fp32 = (_plan(tmp_path, "xsum", synthetic_xsum, *site, *extra)
                  for extra in ((), ("--precision", "fp32")))
    assert auto["computes_in"] == "bf16"
    def key(r):  # the layout, without the FSDP2 dtype options a 16-bit plan adds
        return (tuple(r["mesh"].items()), r["micro_batch"], r["accumulation"],
                r["activation_checkpointing"])

    full = {key(r): r["activation_bytes"] for r in fp32["fits"]}
    kinds, differ = set(), {}
    for row in auto["fits"]:
        kinds |= {dim for dim, n in row["mesh"].items() if n > 1}
        if row["activation_checkpointing"] == "none":  # (full: only fp32 block inputs)
            dims = frozenset(d for d, n in row["mesh"].items() if n > 1)
            differ.setdefault(dims, []).append(
                (row["micro_batch"], row["activation_bytes"] != full[key(row)]))
    assert kinds == {"dp_replicate", "dp_shard", "tp", "pp"}, kinds
    for dims, rows in differ.items():  # every kind of split probed under autocast
        largest = max(micro for micro, _ in rows)
        assert all(d for micro, d in rows if micro == largest), (sorted(dims), rows)
        assert sum(d for _, d in rows) >= 0.5 * len(rows), (sorted(dims), rows)
    assert {r["dropped"] for r in auto["dropped"]} == {r["dropped"] for r in fp32["dropped"]}
