"""The GPU check kit: one command that turns a short loan of a GPU machine into verified
facts about ddl on it, written as one JSON (schema: results/gpu_check.schema.json) and a
markdown summary.

On the GPU machine (one NVIDIA GPU, torch preinstalled, no package registry) it installs
ddl from this checkout with ``pip --no-deps`` plus the carried wheels, then runs, each in
its own process with a time limit, in priority order (gpu_kit/checks.py): what torch
sees; a bf16 8192^3 matmul peak; every workload's tiny preset in bf16 (DDP, NCCL, world of
1), under FSDP, and in fp16; one course-shape run per workload (steps capped); ddl's
pinned-memory loader; a profiled run; then, on the kit's bench copy of the data, ddl's
course run against a plain PyTorch loop (benchmarks/reference/peer_loop.py) in alternating
rounds, and each workload's throughput preset at the largest batch that fits ~80 % of the
GPU (found by a probe). From each run's results.json: throughput, MFU
against the measured peak and the site profile's, the share of training time spent
waiting for data, and torch's peak GPU allocation against ddl's memory report (plus NVML's
view, sampled by the kit). What no longer fits the budget is skipped, and the JSON says so.

    # where pip reaches a registry: the wheels the GPU machine lacks (benchmarks/gpu_wheels/)
    .venv/bin/python benchmarks/gpu_check.py --fetch-wheels
    # on the GPU machine, in the checkout with benchmarks/gpu_wheels/ brought along
    python3 benchmarks/gpu_check.py
    # ddl against its peer and the throughput presets only (docs/measuring.md)
    python3 benchmarks/gpu_check.py --rounds 2 --only 'course-*-r*' --only 'peer-*' \
        --only 'throughput-*'
    # CI / any CPU: a subset with tiny sizes and gloo, in the current environment
    .venv/bin/python benchmarks/gpu_check.py --cpu --out-dir /tmp/gpu-check

Exit code: 0 when no check failed, 1 when one did (the files are written either way),
3 when the kit's own JSON broke its schema. docs/measuring.md, "The GPU check kit".
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from gpu_kit import checks as plan_  # noqa: E402
from gpu_kit import plan_memory  # noqa: E402
from gpu_kit import comparison, report, runner, wheels  # noqa: E402
from machine import describe  # noqa: E402

PROBES = HERE / "gpu_kit" / "probes.py"
PEER = HERE / "reference" / "peer_loop.py"


class Kit:
    """The state one kit run carries from check to check."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.gpu = not args.cpu
        self.work = args.work
        self.deadline = time.monotonic() + args.budget
        self.matmul_peak: float | None = None
        self.status: dict[str, str] = {}
        self.device: dict = {}
        rounds = getattr(args, "rounds", None)
        self.rounds = plan_.PEER_ROUNDS[self.gpu] if rounds is None else rounds
        self.plan = plan_.plan(self.gpu, self.rounds)
        self.batches: dict[str, int] = {}  # batch-search-<w>'s batch, by check name
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if not self.gpu:
            self.env["OMP_NUM_THREADS"] = "1"  # as every rank of a local run (ddl.launch.local)

    # --- the pieces of a check's record ------------------------------------------------
    @staticmethod
    def record(name: str, status: str, seconds: float = 0.0, numbers: dict | None = None,
               error_tail: str | None = None, note: str | None = None,
               command: list[str] | None = None) -> dict:
        return {"name": name, "status": status, "seconds": round(seconds, 2),
                "numbers": numbers or {}, "error_tail": error_tail, "note": note,
                "command": command}

    def ddl(self) -> list[str]:
        script = Path(sys.executable).with_name("ddl")
        if script.exists():
            return [str(script)]
        return [sys.executable, "-c", "import sys; from ddl.commands.cli import main; sys.exit(main())"]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def selected(self, check: plan_.Check) -> bool:
        """Whether ``--only`` selects ``check``. The environment probe (it names the device
        in the file names and the summary), the matmul peak (MFU) and the data of a
        selected workload (reused when already there) always come along."""
        def named(name: str) -> bool:
            return any(fnmatch.fnmatch(name, pattern) for pattern in self.args.only)
        if named(check.name) or check.name in ("environment", "matmul-peak"):
            return True
        if any(named(other.name) for other in self.plan if other.batch_from == check.name):
            return True  # a throughput check brings its batch search along
        return check.kind == "prepare" and any(
            self.selected(other) for other in self.plan
            if other.data == check.data and other.kind != "prepare")

    def why_not(self, check: plan_.Check) -> str | None:
        """Why ``check`` is skipped, or None to run it."""
        if self.args.only and not self.selected(check):
            return "not selected by --only"
        if not self.gpu and check.cpu_skip:
            return check.cpu_skip
        if check.kind == "install" and not self.args.install:
            return "ddl is used as installed beside this Python (no --install)"
        if check.kind != "install" and check.name != "environment" and \
                self.status.get("environment") == "fail":
            return "the environment check failed (no GPU, or ddl not importable)"
        needs = f"prepare-{check.data}"
        if check.workload and check.kind != "prepare" and self.status.get(needs) != "ok":
            return f"{needs} did not succeed ({self.status.get(needs, 'not run')})"
        if self.remaining() < check.estimate_s:
            return (f"budget: {max(self.remaining(), 0):.0f} s of {self.args.budget:.0f} s "
                    f"left, this check needs about {check.estimate_s:.0f} s")
        return None

    def timeout(self) -> float:
        return max(0.1, min(self.args.per_run_timeout, self.remaining()))

    def _failed(self, name: str, outcome: runner.Outcome, command: list[str],
                numbers: dict | None = None) -> dict:
        if outcome.timed_out and self.remaining() <= 0 < \
                self.args.per_run_timeout - outcome.seconds:
            # stopped by the end of the budget, not by its own limit: not ddl's failure
            return self.record(name, "skipped", outcome.seconds, numbers,
                               note=f"stopped after {outcome.seconds:.0f} s: the budget of "
                                    f"{self.args.budget:.0f} s ran out", command=command)
        why = (f"timed out after {outcome.seconds:.0f} s" if outcome.timed_out
               else f"exit code {outcome.returncode}")
        # the reason first: the summary table shows the tail's last line, ddl's own error
        return self.record(name, "fail", outcome.seconds, numbers,
                           f"[{why}]\n{outcome.tail.rstrip()}", command=command)

    # --- the kinds of check ------------------------------------------------------------
    def install(self, check: plan_.Check) -> dict:
        try:
            command = wheels.install_command(self.args.wheels, REPO)
        except FileNotFoundError as exc:
            return self.record(check.name, "fail", error_tail=str(exc))
        outcome = runner.run(command, self.work / "logs" / "install.log", self.timeout(),
                             self.env, cwd=REPO)
        if outcome.returncode != 0:
            return self._failed(check.name, outcome, command)
        return self.record(check.name, "ok", outcome.seconds,
                           {"wheels": len(list((self.args.wheels / "runtime").glob("*.whl")))},
                           command=command)

    def probe(self, check: plan_.Check) -> dict:
        command = [sys.executable, str(PROBES), *check.args, "--device",
                   "cuda" if self.gpu else "cpu"]
        if check.workload:
            command += ["--plugin", check.workload, "--data-dir",
                        str(self.work / "data" / check.data)]
        outcome = runner.run(command, self.work / "logs" / f"{check.name}.log", self.timeout(),
                             self.env, cwd=self.work)
        if outcome.returncode != 0:
            return self._failed(check.name, outcome, command)
        found = json.loads(outcome.tail.strip().splitlines()[-1])
        numbers = {k: v for k, v in found.items() if v is None or isinstance(v, (str, int,
                                                                                  float, bool))}
        note = None
        if check.name == "environment":
            self.device = numbers
        elif check.name == "matmul-peak":
            self.matmul_peak = numbers["peak_flops"]
            note = f"{numbers['dtype']} {numbers['size']}^3; measured by {numbers['source']}"
        elif check.args[0] == "batch-search":
            self.batches[check.name] = numbers["batch_size"]
            note = (f"batch {numbers['batch_size']} ({numbers['limited_by']}-limited; "
                    f"{numbers['fraction']:.0%} of the device's memory)")
        elif check.name == "loader-pinned" and self.gpu and not numbers["pinned_arrived_pinned"]:
            return self.record(check.name, "fail", outcome.seconds, numbers,
                               "pin_memory=True, yet a batch arrived in pageable memory",
                               command=command)
        return self.record(check.name, "ok", outcome.seconds, numbers, note=note,
                           command=command)

    def prepare(self, check: plan_.Check) -> dict:
        data = self.work / "data" / check.data
        done = data / ".gpu-check-prepared"
        if done.exists():
            return self.record(check.name, "ok", note=f"reused {data} from an earlier kit run")
        command = [*self.ddl(), "prepare", "--plugin", check.workload, "--synthetic",
                   "--data-dir", str(data)]
        if check.args == ["bench"]:  # the kit's sizes, the same generator (gpu_kit/bench_data)
            command = [sys.executable, str(PROBES), "synthetic", "--device",
                       "cuda" if self.gpu else "cpu", "--plugin", check.workload,
                       "--data-dir", str(data)]
        outcome = runner.run(command, self.work / "logs" / f"{check.name}.log", self.timeout(),
                             self.env, cwd=self.work)
        if outcome.returncode != 0:
            return self._failed(check.name, outcome, command)
        done.write_text("prepared by benchmarks/gpu_check.py\n")
        return self.record(check.name, "ok", outcome.seconds,
                           note="synthetic data in the real on-disk format", command=command)

    def train(self, check: plan_.Check) -> dict:
        run_dir = self.work / "runs" / check.name
        if run_dir.exists():
            shutil.rmtree(run_dir)  # ddl refuses a run dir that holds a run
        command = [*self.ddl(), "train", "--plugin", check.workload, "--strategy",
                   check.strategy, "--precision", check.precision, "--site", self.args.site,
                   "--launcher", "local", "--nproc", "1", "--device",
                   "cuda" if self.gpu else "cpu", "--epochs", "2", "--keep-checkpoints", "0",
                   "--log-every", "1000000", "--data-dir", str(self.work / "data" / check.data),
                   "--run-dir", str(run_dir), *check.args]
        note = None
        if check.batch_from:
            found = self.batches.get(check.batch_from)
            command += ["--batch-size", str(found)] if found else []
            note = (f"batch {found} from {check.batch_from}" if found else
                    f"the preset's batch: {check.batch_from} found none on this device")
        with runner.GpuMemory(self.gpu) as memory:
            outcome = runner.run(command, self.work / "logs" / f"{check.name}.log",
                                 self.timeout(), self.env, cwd=self.work)
        if outcome.returncode != 0 or not (run_dir / "results.json").exists():
            return self._failed(check.name, outcome, command)
        numbers, problems = plan_.evaluate_train(
            check, run_dir / "results.json", gpu=self.gpu, matmul_peak=self.matmul_peak,
            nvml_peak=memory.peak, nvml_baseline=memory.baseline)
        numbers["nvml_source"] = memory.source
        if check.name.startswith("course-"):  # the plan's memory beside the measured
            predicted, why = plan_memory.compare(
                self.ddl(), run_dir / "results.json", site=self.args.site,
                data_dir=self.work / "data" / check.data, env=self.env, cwd=self.work)
            numbers.update(predicted)
            note = "; ".join(filter(None, [note, why and f"plan: {why}"])) or None
        if problems:
            return self.record(check.name, "fail", outcome.seconds, numbers,
                               "; ".join(problems), note=note, command=command)
        return self.record(check.name, "ok", outcome.seconds, numbers, note=note,
                           command=command)

    def peer(self, check: plan_.Check) -> dict:
        """The plain PyTorch loop beside ddl's course run (benchmarks/reference/peer_loop.py),
        with the same preset, data, precision, step cap and loader workers."""
        train_args = dict(zip(check.args[::2], check.args[1::2]))
        command = [sys.executable, str(PEER), "--plugin", check.workload,
                   "--preset", train_args["--preset"],
                   "--data-dir", str(self.work / "data" / check.data),
                   "--device", "cuda" if self.gpu else "cpu", "--precision", check.precision,
                   "--steps", train_args["--steps-per-epoch"],
                   "--workers", train_args["--workers"]]
        with runner.GpuMemory(self.gpu) as memory:
            outcome = runner.run(command, self.work / "logs" / f"{check.name}.log",
                                 self.timeout(), self.env, cwd=self.work)
        if outcome.returncode != 0:
            return self._failed(check.name, outcome, command)
        found = json.loads(outcome.tail.strip().splitlines()[-1])
        numbers, problems = plan_.evaluate_peer(check, found, gpu=self.gpu,
                                                matmul_peak=self.matmul_peak)
        numbers.update(nvml_peak_used_bytes=memory.peak, nvml_baseline_used_bytes=memory.baseline,
                       nvml_source=memory.source)
        if problems:
            return self.record(check.name, "fail", outcome.seconds, numbers,
                               "; ".join(problems), command=command)
        return self.record(check.name, "ok", outcome.seconds, numbers, command=command)

    # --- the whole run -----------------------------------------------------------------
    def run_all(self) -> list[dict]:
        records: list[dict] = []
        todo = list(self.plan)
        while todo:
            check = todo.pop(0)
            batch = [check]
            if check.kind == "prepare":  # data for all workloads at once: one CPU-bound
                batch += [c for c in todo if c.kind == "prepare"]  # process each
                todo = [c for c in todo if c.kind != "prepare"]
            runnable = []
            for c in batch:
                why = self.why_not(c)
                if why:
                    records.append(self.record(c.name, "skipped", note=why))
                    self.status[c.name] = "skipped"
                else:
                    runnable.append(c)
            with ThreadPoolExecutor(max_workers=max(1, len(runnable))) as pool:
                done = list(pool.map(self.one, runnable))
            for record in done:
                self.status[record["name"]] = record["status"]
                print(f"gpu_check: {record['name']}: {record['status']} "
                      f"({record['seconds']:.0f} s)", flush=True)
            records += done
        order = [c.name for c in self.plan]
        return sorted(records, key=lambda r: order.index(r["name"]))

    def one(self, check: plan_.Check) -> dict:
        try:
            return getattr(self, check.kind)(check)
        except Exception as exc:  # noqa: BLE001 - a kit bug fails its check, not the kit
            return self.record(check.name, "fail",
                               error_tail=f"the kit itself failed: {type(exc).__name__}: {exc}")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true",
                        help="CPU mode (CI): a subset with tiny sizes and gloo")
    parser.add_argument("--fetch-wheels", action="store_true",
                        help="only download the wheels the GPU machine lacks, then stop")
    parser.add_argument("--python-version", default="3.12",
                        help="the GPU machine's Python, for --fetch-wheels (default 3.12)")
    parser.add_argument("--wheels", type=Path, default=HERE / "gpu_wheels")
    parser.add_argument("--install", action=argparse.BooleanOptionalAction, default=None,
                        help="install ddl and the wheels first (default: on in GPU mode)")
    parser.add_argument("--site", help="site profile whose device_peak_flops MFU is "
                        "compared with (default: mn5-acc, H100; used outside Slurm, with "
                        "the local launcher)")
    parser.add_argument("--budget", type=float, help="seconds for all checks (default: 540 "
                        "on a GPU, inside a 10-minute command; 300 on a CPU)")
    parser.add_argument("--per-run-timeout", type=float,
                        help="seconds one check may take (default: 240 GPU, 120 CPU)")
    parser.add_argument("--rounds", type=int, help="rounds of ddl's course run against "
                        "the plain PyTorch peer, per workload (default: 3 on a GPU, 1 on a CPU)")
    parser.add_argument("--only", action="append", metavar="GLOB",
                        help="run only the checks matching (repeatable), e.g. 'course-*'")
    parser.add_argument("--work", type=Path, help="keep data, run dirs and logs here (and "
                        "reuse prepared data); default: a temporary directory")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 0:
        parser.error(f"--rounds must be 0 or more (got {args.rounds})")
    gpu = not args.cpu
    args.install = gpu if args.install is None else args.install
    # the CPU mode too (the same launcher); a CPU run gets no MFU against its GPU peak
    args.site = args.site or "mn5-acc"
    args.budget = args.budget or (540.0 if gpu else 300.0)
    args.per_run_timeout = args.per_run_timeout or (240.0 if gpu else 120.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.fetch_wheels:
        got = wheels.fetch(args.wheels, args.python_version)
        print(f"gpu_check: {len(got['wheels'])} wheels, {got['bytes'] / 2 ** 20:.1f} MiB in "
              f"{got['folder']}: {', '.join(got['wheels'])}")
        return 0
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ddl-gpu-check-") as tmp:
        args.work = (args.work or Path(tmp)).resolve()
        args.work.mkdir(parents=True, exist_ok=True)
        kit = Kit(args)
        records = kit.run_all()
    document = {
        "kit": "gpu_check", "schema_version": 2, "mode": "gpu" if kit.gpu else "cpu",
        "started_at": started, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - t0, 1), "budget_s": args.budget,
        "per_run_timeout_s": args.per_run_timeout, "site": args.site, "device": kit.device,
        "machine": describe(), "command": [sys.executable, *sys.argv],
        "checks": records,
        "rounds": kit.rounds,
        "comparison": comparison.compare(records),
        "counts": {s: sum(r["status"] == s for r in records) for s in ("ok", "fail", "skipped")},
    }
    name = slug(kit.device.get("device_name", "gpu") if kit.gpu else "cpu")
    stem = f"gpu_check-{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{stem}.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / f"{stem}.md").write_text(report.markdown(document))
    print(f"gpu_check: {document['counts']}; {out} and {stem}.md", flush=True)
    problems = report.validate(document)
    if problems:
        print("gpu_check: the JSON breaks its schema: " + "; ".join(problems[:5]),
              file=sys.stderr)
        return 3
    return 1 if document["counts"]["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
