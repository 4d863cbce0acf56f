"""What the kit checks, in priority order (a budget that runs out skips the tail), and how
a training run's results.json becomes a check's numbers and verdict.

Every training check is ``ddl train`` itself (the CLI, the local launcher, one process: a
world of 1 whose process group is NCCL on a GPU and gloo on a CPU), so what passes here is
what a user's first single-GPU run does. The CPU mode (CI) runs a subset with tiny sizes;
the rest is listed as skipped with the reason, so both modes write the same checks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

WORKLOADS = ("mnist", "cifar", "imagewoof", "xsum")
STARVED_SHARE = 0.2  # a fifth of the training time spent waiting for batches
# The CPU mode's share (~95 CPU s on 2 cores; CI's test runs only its course round and
# peer: docs/measuring.md): each kind of check once, on MNIST only (xsum's imports and
# preparation cost CI ~20 s; the GPU mode ran every workload on an H200, 2026-11-26).
# profile-mnist is itself a tiny mnist bf16 run, so tiny-mnist-bf16 is left out.
# The first round of ddl against its peer stands in for course-mnist-bf16 (the same run on
# the kit's own copy of the data).
CPU_SUBSET = {"environment", "matmul-peak", "prepare-mnist", "fsdp-mnist-bf16",
              "loader-pinned", "profile-mnist", "prepare-mnist-bench", "course-mnist-bf16-r1",
              "peer-mnist-bf16-r1"}
PEER_ROUNDS = {True: 3, False: 1}  # default rounds of ddl against its peer: GPU, CPU
THROUGHPUT_ORDER = ("cifar", "xsum", "imagewoof", "mnist")  # the acceptance's first


@dataclass
class Check:
    name: str
    kind: str  # install, probe, prepare or train
    estimate_s: float  # what the budget must still hold to start it
    workload: str | None = None
    args: list[str] = field(default_factory=list)  # the probe's or `ddl train`'s own
    precision: str | None = None
    strategy: str = "ddp"
    cpu_skip: str | None = None  # why the CPU mode leaves it out (None: it runs it)
    data: str | None = None  # the data set it reads (prepare-<data>); None: the workload's
    batch_from: str | None = None  # the batch-search check whose batch it trains with

    def __post_init__(self) -> None:
        self.data = self.data or self.workload


def plan(gpu: bool, rounds: int | None = None) -> list[Check]:
    # tiny: the precision and strategy paths, loading in the training process; course: the
    # courses' shapes with 4 pinned-memory loader workers on a GPU (none on the 2-core CI
    # machine, where they would only compete), long enough that the workers' start-up at
    # the epoch's beginning is not most of its data wait
    tiny = ["--preset", "tiny", "--steps-per-epoch", "20" if gpu else "2", "--workers", "0"]
    course = ["--preset", "course", "--steps-per-epoch", "50" if gpu else "2",
              "--workers", "4" if gpu else "0"]
    # Estimates (s, on a GPU: start-up ~10 s of each) only decide whether a check may still
    # start (course-xsum took 84 s on an H200, 103 s on an H100); a check running into the end of the budget is stopped and listed as skipped.
    # The whole list does not fit one 10-minute call: the first call gets through the
    # fp16 runs and the first course runs; `--only` runs the rest in a second one.
    s = 1.0 if gpu else 0.5
    course_checks = {w: Check(f"course-{w}-bf16", "train", (130 if w == "xsum" else 60) * s,
                              w, course, "bf16") for w in WORKLOADS}
    checks = [
        Check("install", "install", 60),
        Check("environment", "probe", 20, args=["environment"]),
        Check("matmul-peak", "probe", 20,
              args=["matmul", "--size", "8192" if gpu else "512", "--repeats", "10"]),
        *(Check(f"prepare-{w}", "prepare", 40, workload=w) for w in WORKLOADS),
        *(Check(f"tiny-{w}-bf16", "train", 25 * s, w, tiny, "bf16") for w in WORKLOADS),
        *(Check(f"fsdp-{w}-bf16", "train", 25 * s, w, tiny, "bf16", "fsdp")
          for w in WORKLOADS),
        *(Check(f"tiny-{w}-fp16", "train", 25, w, tiny, "fp16",
                cpu_skip="fp16 needs a GPU (ddl refuses it on a CPU)") for w in WORKLOADS),
        *(course_checks[w] for w in ("mnist", "cifar", "imagewoof")),
        Check("loader-pinned", "probe", 40, "imagewoof" if gpu else "mnist",
              ["loader", "--preset", "course" if gpu else "tiny", "--workers",
               "4" if gpu else "0", "--batches", "20" if gpu else "3"]),
        Check("profile-mnist", "train", 30 * s, "mnist",
              ["--preset", "tiny", "--steps-per-epoch", "8", "--profile", "3"], "bf16"),
        course_checks["xsum"],  # ROUGE with t5-base generating 300 summaries: the longest
        *(Check(f"prepare-{w}-bench", "prepare", 60, w, ["bench"], data=f"{w}-bench")
          for w in WORKLOADS),
        *peer_rounds(gpu, PEER_ROUNDS[gpu] if rounds is None else rounds, course),
        *throughput_checks(gpu),
        *sync_checks(gpu),
        # issue 40: a model far larger than the course's under FSDP on one GPU: what
        # building it costs (memory_per_rank[].build_peak_bytes) and its MFU
        Check("t5large-fsdp-bf16", "train", 150, "xsum",
              ["--preset", "t5-large", "--steps-per-epoch", "10", "--workers", "4"], "bf16",
              "fsdp", data="xsum-bench",
              cpu_skip="t5-large (0.7B parameters) is a GPU check; on a CPU: "
                       "docs/workloads/xsum.md"),
    ]
    for check in checks:
        if (not gpu and check.cpu_skip is None and check.name not in CPU_SUBSET
                and check.kind != "install"):  # install follows --install in both modes
            check.cpu_skip = "not in the CPU subset (CI time; docs/measuring.md)"
    return checks


def peer_rounds(gpu: bool, rounds: int, course: list[str]) -> list[Check]:
    """ddl's course run and the plain PyTorch loop (benchmarks/reference/peer_loop.py) in
    alternating rounds per workload, on the kit's bench copy of the data (its xsum test
    split holds 32 articles, so that ROUGE's generation does not take most of a round)."""
    out = []
    for w in WORKLOADS:
        ddl_s, peer_s = (60 if w == "xsum" else 40, 50 if w == "xsum" else 30) if gpu \
            else (20, 15)
        for k in range(1, rounds + 1):
            out += [Check(f"course-{w}-bf16-r{k}", "train", ddl_s, w, course, "bf16",
                          data=f"{w}-bench"),
                    Check(f"peer-{w}-bf16-r{k}", "peer", peer_s, w, course, "bf16",
                          data=f"{w}-bench")]
    return out


def throughput_checks(gpu: bool) -> list[Check]:
    """Per workload: the largest batch that fits ~80 % of the GPU's memory (a probe), then
    ddl's throughput preset at that batch (--batch-size): a GPU filled, where MFU means
    something. 8 loader workers on the GPU machine's 16 cores."""
    out = []
    for w in THROUGHPUT_ORDER:
        out += [Check(f"batch-search-{w}", "probe", 60, w, ["batch-search"], data=f"{w}-bench",
                      cpu_skip="the batch search fills a GPU's memory: GPU only"),
                Check(f"throughput-{w}-bf16", "train", 90 if w == "xsum" else 60, w,
                      ["--preset", "throughput", "--steps-per-epoch", "30" if gpu else "2",
                       "--workers", "8" if gpu else "0"], "bf16", data=f"{w}-bench",
                      batch_from=f"batch-search-{w}")]
    return out


def sync_checks(gpu: bool) -> list[Check]:
    """Per workload: ddl's course run with ``--count-syncs``, which on CUDA counts every
    synchronising call of each step with torch's sync debug mode (ddl.worker.observe.step_breakdown):
    a step must make none that no flag asked for. Apart from the timed rounds (the warnings
    cost host time). On a CPU, tests/distributed/test_step_syncs.py holds the same rule."""
    return [Check(f"syncs-{w}-bf16", "train", 70 if w == "xsum" else 40, w,
                  ["--preset", "course", "--steps-per-epoch", "20", "--workers", "4",
                   "--count-syncs"], "bf16", data=f"{w}-bench",
                  cpu_skip="on a CPU the same rule is tests/distributed/test_step_syncs.py")
            for w in WORKLOADS]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def evaluate_train(check: Check, results_file: Path, *, gpu: bool, matmul_peak: float | None,
                   nvml_peak: int | None, nvml_baseline: int | None
                   ) -> tuple[dict, list[str]]:
    """The numbers of one finished ``ddl train``, and what contradicts the request."""
    r = json.loads(results_file.read_text())
    problems = []
    want = {"device": "cuda" if gpu else "cpu", "backend": "nccl" if gpu else "gloo"}
    for key, value in want.items():
        if r["world"][key] != value:
            problems.append(f"world.{key} is {r['world'][key]}, expected {value}")
    if r["precision"] != check.precision:
        problems.append(f"precision is {r['precision']}, expected {check.precision}")
    if r["strategy"] != check.strategy:
        problems.append(f"strategy is {r['strategy']}, expected {check.strategy}")
    losses = {"last epoch's train loss": r["epochs"][-1]["train"].get("loss"),
              "test loss": r["final"]["test"].get("loss")}
    problems += [f"{what} is {value}" for what, value in losses.items()
                 if value is not None and not _finite(value)]

    measured = [e for e in r["epochs"] if not e["warmup"]] or r["epochs"]
    train_s = sum(e["time_s"] for e in measured)
    wait_share = sum(e["data_wait_s"] for e in measured) / train_s if train_s else None
    mem = r["memory_per_rank"][0]
    device_peak = mem.get("device_peak_allocated_bytes")
    if gpu and device_peak is None:
        problems.append("memory_per_rank[0] has no device_peak_allocated_bytes on a GPU")
    if device_peak is not None and device_peak < mem["model_state_bytes"]:
        problems.append(f"torch's peak allocation {device_peak} B is below ddl's model "
                        f"state {mem['model_state_bytes']} B, which is all on the device")
    mfu = r["mfu"]
    achieved = mfu["achieved_flops_per_device"]
    use = r["utilisation"][0]
    numbers = {
        "strategy": r["strategy"], "precision": r["precision"],
        "backend": r["world"]["backend"], "device": r["world"]["device"],
        "preset": r["preset"], "steps_per_epoch": r["steps_per_epoch"],
        "global_batch": r["batch"]["global"], "loader_workers": r["loader_workers"],
        "samples_per_s": r["summary"]["samples_per_s"],
        "epoch_time_s": r["summary"]["epoch_time_s"],
        "train_loss": losses["last epoch's train loss"], "test_loss": losses["test loss"],
        "data_wait_share": wait_share,
        "data_starved": wait_share is not None and wait_share > STARVED_SHARE,
        "achieved_flops_per_device": achieved,
        "mfu_vs_profile_peak": mfu["mfu"], "profile_peak_flops": mfu["peak_flops_per_device"],
        "mfu_vs_measured_peak": achieved / matmul_peak if achieved and matmul_peak else None,
        "measured_peak_flops": matmul_peak,
        "model_state_bytes": mem["model_state_bytes"],
        "device_peak_allocated_bytes": device_peak,
        "device_peak_over_model_state": (device_peak / mem["model_state_bytes"]
                                         if device_peak and mem["model_state_bytes"] else None),
        "nvml_peak_used_bytes": nvml_peak, "nvml_baseline_used_bytes": nvml_baseline,
        "peak_rss_bytes": mem["peak_rss_bytes"],
        "device_util_percent_mean": use.get("device_util_percent_mean"),
        "device_util_source": use.get("device_source"),
    }
    breakdown = r.get("step_breakdown") or {}
    per_step = breakdown.get("per_step") or {}
    numbers["build_peak_bytes"] = mem.get("build_peak_bytes")
    numbers["parameters"] = r.get("parameters")
    numbers.update({"ddl_share": breakdown.get("ddl_share"),
                    "strategy_per_step_s": per_step.get("strategy_s"),
                    "ddl_per_step_s": per_step.get("ddl_s"),
                    "tf32": r.get("tf32")})
    syncs = breakdown.get("syncs")
    if syncs is not None:
        numbers.update({"syncs_counted_by": syncs["counted_by"],
                        "syncs_unrequested": syncs["unrequested"],
                        "syncs_unrequested_where": "; ".join(
                            f"{where} x{n}" for where, n in syncs["unrequested_where"].items())})
        if syncs["unrequested"]:
            problems.append(f"{syncs['unrequested']} host-device syncs at steps no flag "
                            f"asked for: {numbers['syncs_unrequested_where']}")
    if check.args and "--profile" in check.args:
        profile = (r.get("profile") or [{}])[0]
        trace = profile.get("trace")
        if not trace or not (results_file.parent / Path(trace).name).exists():
            problems.append(f"--profile wrote no trace ({profile.get('note', 'no profile[]')})")
        for key in ("op_time_s", "compute_time_s", "communication_time_s",
                    "data_loading_time_s", "communication_fraction"):
            numbers[f"profile_{key}"] = profile.get(key)
    return numbers, problems


def evaluate_peer(check: Check, found: dict, *, gpu: bool, matmul_peak: float | None
                  ) -> tuple[dict, list[str]]:
    """The numbers of one peer loop (its JSON line), and what contradicts the request: the
    same device, backend, precision and pinned memory as ddl's run beside it."""
    problems = []
    want = {"device": "cuda" if gpu else "cpu", "backend": "nccl" if gpu else "gloo",
            "precision": check.precision, "pin_memory": gpu}
    for key, value in want.items():
        if found.get(key) != value:
            problems.append(f"{key} is {found.get(key)}, expected {value}")
    if not _finite(found.get("train_loss")):
        problems.append(f"the last epoch's train loss is {found.get('train_loss')}")
    numbers = {k: v for k, v in found.items()
               if v is None or isinstance(v, (str, int, float, bool))}
    numbers["preset"] = found.get("preset")
    flops = found.get("flops_per_sample")
    achieved = flops * found["samples_per_s"] if flops else None
    numbers.update({
        "achieved_flops_per_device": achieved, "measured_peak_flops": matmul_peak,
        "mfu_vs_measured_peak": achieved / matmul_peak if achieved and matmul_peak else None,
        "data_starved": found["data_wait_share"] > STARVED_SHARE})
    return numbers, problems
