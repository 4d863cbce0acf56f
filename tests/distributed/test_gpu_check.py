"""The GPU check kit in its CPU mode, end to end: real `ddl prepare` / `ddl train`
subprocesses and the kit's probes, on the CPU with gloo, so the kit cannot rot between the
rare loans of a GPU machine. Its JSON is checked against the documented schema with the
kit's own validator (jsonschema is not among the development packages), and that validator
is shown to reject broken documents.

The GPU path itself (cuda, NCCL, fp16, pinned memory, NVML) cannot run here: no GPU."""

import copy
import json
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.distributed

sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_kit import batch_search, checks, comparison, report  # noqa: E402

KIT = str(REPO / "benchmarks" / "gpu_check.py")


def _kit(out_dir, *args, timeout=400):
    proc = subprocess.run([sys.executable, KIT, "--cpu", "--out-dir", str(out_dir), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    written = sorted(out_dir.glob("gpu_check-cpu-*.json"))
    assert len(written) == 1, proc.stdout + proc.stderr
    assert written[0].with_suffix(".md").exists()
    return proc, json.loads(written[0].read_text()), written[0].with_suffix(".md").read_text()


# What the end-to-end run selects (`--only`; environment, matmul-peak and the data come
# along): ddl's course run and its peer, round 1. The rest of the CPU subset
# (checks.CPU_SUBSET: fsdp-mnist-bf16, loader-pinned, profile-mnist and their prepare-mnist)
# cost ~50 of its ~95 CPU s (2026-11-29, 2 cores) and is covered in process below and by
# tests/distributed/test_equivalence_matrix.py (FSDP, bf16) and test_profile.py (--profile).
SELECTED = ("course-mnist-bf16-r1", "peer-mnist-bf16-r1")
RUNS = {"environment", "matmul-peak", "prepare-mnist-bench", *SELECTED}


def test_cpu_mode_end_to_end(tmp_path):
    """One run of the kit (~45 CPU s on 2 cores), checked several ways below; one test, so
    that pytest-xdist cannot run the kit once per worker."""
    only = [arg for name in SELECTED for arg in ("--only", name)]
    proc, doc, summary = _kit(tmp_path / "out", "--work", str(tmp_path / "work"), *only)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _runs_its_subset_and_lists_every_gpu_check(doc, summary)
    _training_checks_report_what_ran_and_the_measurements(doc)
    _the_loader_probe_on_the_kits_data(tmp_path / "work" / "data" / "mnist-bench")
    _the_validator_rejects_broken_documents(doc)
    _gpu_verdicts_from_a_gpu_shaped_results_file(tmp_path / "work" / "runs")
    _ddl_beside_its_peer(doc, summary, tmp_path / "work" / "logs")


def test_cpu_mode_without_only_runs_the_cpu_subset(tmp_path):
    """What the CPU mode runs when nothing narrows it (the kit's decisions, in process: the
    end-to-end test above selects a part of it): the CPU subset, and the rest skipped with
    its reason."""
    import argparse

    import gpu_check

    args = argparse.Namespace(cpu=True, work=tmp_path, budget=300.0, only=None, rounds=None,
                              install=False)
    kit = gpu_check.Kit(args)
    kit.status = {"environment": "ok", **{c.name: "ok" for c in kit.plan
                                          if c.kind == "prepare"}}
    why = {c.name: kit.why_not(c) for c in kit.plan}
    assert {name for name, reason in why.items() if reason is None} == checks.CPU_SUBSET
    assert "needs a GPU" in why["tiny-xsum-fp16"]
    assert "GPU only" in why["batch-search-cifar"]
    assert "not in the CPU subset" in why["tiny-mnist-bf16"]
    assert "no --install" in why["install"]
    # a prepare that did not succeed skips what reads its data
    kit.status["prepare-mnist"] = "fail"
    assert "prepare-mnist did not succeed" in kit.why_not(
        next(c for c in kit.plan if c.name == "fsdp-mnist-bf16"))


def _runs_its_subset_and_lists_every_gpu_check(doc, summary):
    assert report.validate(doc) == []
    by_name = {c["name"]: c for c in doc["checks"]}
    # the same checks as the GPU mode (at the same rounds), in the same order; the CPU
    # runs what --only selected (and what comes along with it) only
    assert doc["rounds"] == 1
    assert list(by_name) == [c.name for c in checks.plan(gpu=True, rounds=1)]
    assert {n for n, c in by_name.items() if c["status"] == "ok"} == RUNS
    assert RUNS <= checks.CPU_SUBSET
    assert "not selected by --only" in by_name["fsdp-mnist-bf16"]["note"]
    assert doc["mode"] == "cpu" and doc["site"] == "mn5-acc"  # its peak, with --device cpu
    for name, check in by_name.items():
        assert f"| {name} | {check['status']} |" in summary


def _training_checks_report_what_ran_and_the_measurements(doc):
    by_name = {c["name"]: c for c in doc["checks"]}
    peak = by_name["matmul-peak"]["numbers"]["peak_flops"]
    assert peak > 1e8  # any CPU does more than 0.1 GFLOP/s on one thread
    assert by_name["environment"]["numbers"]["gloo_available"] is True
    n = by_name["course-mnist-bf16-r1"]["numbers"]
    assert (n["strategy"], n["precision"], n["backend"], n["device"]) == \
        ("ddp", "bf16", "gloo", "cpu")
    assert n["samples_per_s"] > 0 and 0 <= n["data_wait_share"] <= 1
    assert n["mfu_vs_measured_peak"] == pytest.approx(n["achieved_flops_per_device"] / peak)
    # a CPU run is not measured against the GPU site's peak (ddl.worker.mfu.site_peak:
    # "MFU 0.0 %" said nothing); on a GPU both are numbers
    assert n["profile_peak_flops"] is None and n["mfu_vs_profile_peak"] is None
    assert 0 < n["model_state_bytes"] < n["peak_rss_bytes"]
    assert n["preset"] == "course"
    # `ddl plan`'s prediction beside the measurement (on a CPU: model state + activations)
    assert n["plan_predicted_bytes"] > 0 and n["plan_measured_bytes"] > 0
    assert n["plan_measured_over_predicted"] == pytest.approx(
        n["plan_measured_bytes"] / n["plan_predicted_bytes"])


def _the_loader_probe_on_the_kits_data(data_dir):
    """loader-pinned's probe (gpu_kit/probes.py loader), in process on the data the kit
    prepared: on a CPU unpinned only, and its batches arrive pageable."""
    from gpu_kit import probes

    loader = probes.loader("cpu", "mnist", "tiny", str(data_dir), workers=0, batches=3)
    assert loader["unpinned_batches"] == 3 and loader["unpinned_batches_per_s"] > 0
    assert loader["unpinned_arrived_pinned"] is False and "pinned_batches" not in loader
    assert loader["unpinned_copy_gb_per_s"] is None or loader["unpinned_copy_gb_per_s"] > 0


def _the_validator_rejects_broken_documents(doc):
    breakages = {
        "status": lambda d: d["checks"][0].update(status="passed"),
        "missing": lambda d: d["checks"][1].pop("seconds"),
        "extra": lambda d: d.update(verdict="fine"),
        "number type": lambda d: d["checks"][1]["numbers"].update(shape=[1, 2]),
        "counts": lambda d: d["counts"].update(ok=d["counts"]["ok"] + 1),
        "silent failure": lambda d: d["checks"][1].update(status="fail", error_tail=None),
        "silent skip": lambda d: d["checks"][0].update(note=None),
        "bad name": lambda d: d["checks"][0].update(name="Tiny MNIST"),
    }
    for what, breaking in breakages.items():
        broken = copy.deepcopy(doc)
        breaking(broken)
        assert report.validate(broken), what


def test_budget_and_timeouts_turn_into_skipped_and_failed_checks(tmp_path):
    proc, doc, _ = _kit(tmp_path / "budget", "--budget", "1", timeout=60)
    assert proc.returncode == 0, proc.stderr  # nothing ran, nothing failed
    assert report.validate(doc) == []
    assert all(c["status"] == "skipped" for c in doc["checks"])
    assert "budget: " in {c["name"]: c for c in doc["checks"]}["environment"]["note"]

    # torch cannot be imported in 0.2 s: the probe is stopped and the check fails
    proc, doc, _ = _kit(tmp_path / "timeout", "--only", "environment",
                        "--per-run-timeout", "0.2", timeout=60)
    assert proc.returncode == 1
    env = {c["name"]: c for c in doc["checks"]}["environment"]
    assert env["status"] == "fail" and "timed out" in env["error_tail"]
    assert {c["status"] for c in doc["checks"] if c["name"] != "environment"} == {"skipped"}


def test_install_without_carried_wheels_fails_in_its_check(tmp_path):
    """--install against an empty wheel folder: the check fails naming the fix, and the
    development venv is never touched (pip does not run: no install log). In process: the
    kit as a subprocess also ran the environment and matmul probes that come along with
    --only (13 s); a failed check's exit code 1 is test_budget_and_timeouts_... 's."""
    import gpu_check

    args = gpu_check.parse(["--cpu", "--install", "--only", "install", "--wheels",
                            str(tmp_path / "no-wheels"), "--work", str(tmp_path / "work")])
    kit = gpu_check.Kit(args)
    check = kit.plan[0]
    assert check.name == "install" and kit.why_not(check) is None  # --install selects it
    install = kit.one(check)
    assert install["name"] == "install" and install["status"] == "fail"
    assert "--fetch-wheels" in install["error_tail"]
    assert not (tmp_path / "work" / "logs" / "install.log").exists()
    document = {"kit": "gpu_check", "schema_version": 2, "mode": "cpu", "started_at": "",
                "finished_at": "", "wall_s": 0, "budget_s": 300, "per_run_timeout_s": 120,
                "site": "mn5-acc", "device": {}, "machine": {}, "command": [],
                "checks": [install], "counts": {"ok": 0, "fail": 1, "skipped": 0}}
    assert report.validate(document) == []  # a failed check's record as the schema says


def _ddl_beside_its_peer(doc, summary, logs):
    """Round 1 of ddl against the plain PyTorch loop, and the comparison built from it."""
    by_name = {c["name"]: c for c in doc["checks"]}
    ddl, peer = by_name["course-mnist-bf16-r1"], by_name["peer-mnist-bf16-r1"]
    n = peer["numbers"]
    assert (n["device"], n["backend"], n["precision"], n["preset"]) == \
        ("cpu", "gloo", "bf16", "course")
    assert n["batch_size"] == ddl["numbers"]["global_batch"]
    assert n["steps_per_epoch"] == ddl["numbers"]["steps_per_epoch"]
    assert n["samples_per_s"] > 0 and 0 <= n["data_wait_share"] <= 1
    assert 0 < n["train_loss"] < 2.4  # ln 10 = 2.30 at chance: the peer trains
    (entry,) = doc["comparison"]
    assert entry["workload"] == "mnist" and entry["rounds"] == 1
    assert entry["ratio_ddl_over_peer"] == pytest.approx(
        ddl["numbers"]["samples_per_s"] / n["samples_per_s"])
    assert entry["peer_data_wait_share"] == n["data_wait_share"]
    assert "| mnist | 1/1 of 1 |" in summary

    # the GPU mode's verdict on the peer's own JSON line, rewritten as on a GPU
    found = json.loads((logs / "peer-mnist-bf16-r1.log").read_text().strip().splitlines()[-1])
    found.update(device="cuda", backend="nccl", pin_memory=True)
    check = next(c for c in checks.plan(gpu=True) if c.name == "peer-mnist-bf16-r1")
    assert checks.evaluate_peer(check, found, gpu=True, matmul_peak=1e15)[1] == []
    for key, value in {"backend": "gloo", "pin_memory": False, "precision": "fp32",
                       "train_loss": float("nan")}.items():
        problems = checks.evaluate_peer(check, {**found, key: value}, gpu=True,
                                        matmul_peak=1e15)[1]
        assert any(key.split("_")[0] in p for p in problems), key


def _gpu_verdicts_from_a_gpu_shaped_results_file(runs):
    """The GPU mode's verdict on a results.json, shown on this run's real file rewritten
    as a GPU run would write it (a stand-in: no GPU here)."""
    real = json.loads((runs / "course-mnist-bf16-r1" / "results.json").read_text())
    real["world"].update(device="cuda", backend="nccl")
    state = real["memory_per_rank"][0]["model_state_bytes"]
    real["memory_per_rank"][0]["device_peak_allocated_bytes"] = 3 * state
    check = next(c for c in checks.plan(gpu=True) if c.name == "course-mnist-bf16-r1")

    def verdict(change=lambda r: None):
        results = copy.deepcopy(real)
        change(results)
        path = runs / "gpu-shaped.json"
        path.write_text(json.dumps(results))
        return checks.evaluate_train(check, path, gpu=True, matmul_peak=1e15,
                                     nvml_peak=None, nvml_baseline=None)

    numbers, problems = verdict()
    assert problems == [] and numbers["device_peak_over_model_state"] == pytest.approx(3)
    wrong = {
        "world.backend is gloo": lambda r: r["world"].update(backend="gloo"),
        "precision is fp32": lambda r: r.update(precision="fp32"),
        "below ddl's model state": lambda r: r["memory_per_rank"][0].update(
            device_peak_allocated_bytes=state - 1),
        "no device_peak_allocated_bytes": lambda r: r["memory_per_rank"][0].pop(
            "device_peak_allocated_bytes"),
        "test loss is nan": lambda r: r["final"]["test"].update(loss=float("nan")),
    }
    for needle, change in wrong.items():
        assert any(needle in p for p in verdict(change)[1]), needle

    # the CPU subset's other training checks (not run above) on the same file: an FSDP
    # check given a DDP run; a profiled check, with and without its trace on disk
    plan = {c.name: c for c in checks.plan(gpu=True)}
    path = runs / "gpu-shaped.json"
    path.write_text(json.dumps(real))
    _, problems = checks.evaluate_train(plan["fsdp-mnist-bf16"], path, gpu=True,
                                        matmul_peak=1e15, nvml_peak=None, nvml_baseline=None)
    assert any("strategy is ddp, expected fsdp" in p for p in problems), problems
    path.write_text(json.dumps({**real, "profile": [{"rank": 0, "trace": "trace-rank0.json",
                                                      "op_time_s": 0.25}]}))

    def profiled():
        return checks.evaluate_train(plan["profile-mnist"], path, gpu=True, matmul_peak=1e15,
                                     nvml_peak=None, nvml_baseline=None)
    assert any("--profile wrote no trace" in p for p in profiled()[1])
    (runs / "trace-rank0.json").write_text("{}")
    numbers, problems = profiled()
    assert problems == [] and numbers["profile_op_time_s"] == 0.25


def test_only_brings_the_environment_peak_and_the_workloads_data_along(tmp_path):
    """A second call with `--only course-xsum-bf16` once wrote its files as device `gpu`
    with no torch version (the environment probe was not selected) and had to name
    prepare-xsum by hand."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import argparse

    import gpu_check

    def chosen(*only, rounds=None):
        args = argparse.Namespace(cpu=False, work=tmp_path, budget=10.0, only=list(only),
                                  rounds=rounds)
        kit = gpu_check.Kit(args)
        return {c.name for c in kit.plan if kit.selected(c)}

    assert chosen("course-xsum-bf16") == {"environment", "matmul-peak", "prepare-xsum",
                                          "course-xsum-bf16"}
    # rounds on the bench data; a throughput check brings its batch search along
    assert chosen("*-cifar-bf16-r*", "throughput-cifar-*", rounds=2) == {
        "environment", "matmul-peak", "prepare-cifar-bench", "course-cifar-bf16-r1",
        "peer-cifar-bf16-r1", "course-cifar-bf16-r2", "peer-cifar-bf16-r2",
        "batch-search-cifar", "throughput-cifar-bf16"}


def test_rounds_alternate_and_the_comparison_takes_medians_of_round_ratios():
    names = [c.name for c in checks.plan(gpu=True, rounds=3) if c.workload == "cifar"
             and c.kind in ("train", "peer") and c.name.endswith(("-r1", "-r2", "-r3"))]
    assert names == [f"{side}-cifar-bf16-r{k}" for k in (1, 2, 3) for side in ("course", "peer")]

    def record(name, rate, status="ok"):
        return {"name": name, "status": status, "numbers": {
            "samples_per_s": rate, "device_util_percent_mean": rate / 100,
            "data_wait_share": 0.01}}
    # ratios 1.0, 2.0, 0.5 by round: the median of the ratios is 1.0, while the ratio of
    # the medians would be 200/200 = 1.0 too; round 4's peer failed: not a pair
    records = [record("course-cifar-bf16-r1", 100), record("peer-cifar-bf16-r1", 100),
               record("course-cifar-bf16-r2", 400), record("peer-cifar-bf16-r2", 200),
               record("course-cifar-bf16-r3", 200), record("peer-cifar-bf16-r3", 400),
               record("course-cifar-bf16-r4", 900), record("peer-cifar-bf16-r4", 1, "fail"),
               record("course-xsum-bf16-r1", 5, "skipped")]
    (entry,) = comparison.compare(records)
    assert entry["workload"] == "cifar" and entry["rounds"] == 4
    assert (entry["ddl_rounds_ok"], entry["peer_rounds_ok"]) == (4, 3)
    assert entry["ratio_ddl_over_peer"] == 1.0
    assert (entry["ratio_min"], entry["ratio_max"]) == (0.5, 2.0)
    assert entry["ddl_samples_per_s"] == 300 and entry["peer_samples_per_s"] == 200
    assert entry["peer_gpu_busy_percent"] == 2.0


def test_batch_search_doubles_then_bisects_within_the_data_ceiling():
    """The search on a stand-in memory limit (the probe itself needs a GPU)."""
    tried = []

    def fits_up_to(limit):
        def fits(n):
            tried.append(n)
            return n <= limit
        return fits

    assert batch_search.largest(fits_up_to(1000), 256, 10000) == 992
    assert tried[:4] == [256, 512, 1024, 768]  # doubling, then bisecting
    assert batch_search.largest(fits_up_to(10 ** 6), 256, 4096) == 4096  # the data's cap
    assert batch_search.largest(fits_up_to(100), 256, 10000) == 96  # halving first
    assert batch_search.largest(fits_up_to(0), 4, 100) == 0
    import torch

    batch = ({"ids": torch.arange(6).view(3, 2)}, torch.tensor([0, 1, 2]))
    tiled = batch_search._tile(batch, 7)
    assert tiled[0]["ids"].shape == (7, 2) and tiled[1].tolist() == [0, 1, 2, 0, 1, 2, 0]
