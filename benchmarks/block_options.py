"""What activation checkpointing saves and what torch.compile costs or gains, per workload,
on this machine (issue 22).

Activation memory: the bytes one training step keeps for its backward pass, counted by
ddl's own meter (``ddl.worker.observe.activation_memory``, what results.json reports as
``saved_for_backward_bytes``), with ``--activation-checkpointing`` none, full and selective
applied the way the trainer applies them (``ddl.worker.build.activation_checkpointing`` on the
workload's block units). Goal: full <= 0.5 x none for xsum's course shape (t5-base,
512-token inputs). The batch is capped (``--batch``) to keep a CPU step short: what a
sample keeps does not depend on how many there are.

Compile: the median optimizer-step time of the same model eager and with its block units
compiled (``ddl.worker.build.compiling``, inductor), after warm-up steps that include the
compilation, whose time is reported apart. CPU ratios say what they say here, whatever
they are; on GPUs compile pays off through fused kernels this machine does not run.

    .venv/bin/python benchmarks/block_options.py                  # the full set (~10 min)
    .venv/bin/python benchmarks/block_options.py --quick          # tiny presets (CI)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from data_flags import add_data_dir_flag, given_data_dirs  # noqa: E402
from machine import describe  # noqa: E402

RESULTS = HERE / "results" / "block_options.json"
GOAL_FULL_OVER_NONE = 0.5  # for xsum's course shape


def _prepare(plugin: str, root: Path) -> Path:
    data = root / plugin
    subprocess.run([str(Path(sys.executable).with_name("ddl")), "prepare", "--plugin", plugin,
                    "--synthetic", "--data-dir", str(data)], check=True, capture_output=True)
    return data


def _workload_and_batch(plugin: str, preset: str, batch: int, data: Path):
    from ddl.contract.plugins import Plugins
    from ddl.worker.train.loaders import train_loader

    spec = Plugins().workload(plugin)
    workload = spec.create(spec.presets[preset])
    train = workload.datasets(data)["train"]
    loader = train_loader(train, batch_size=batch, replicas=1, rank=0, seed=1, workers=0,
                          pin_memory=False)
    import torch

    return workload, workload.to_device(next(iter(loader)), torch.device("cpu"))


def _step(workload, model, optimizer, batch) -> None:
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=True)
    loss = workload.loss(workload.forward(model, inputs), targets)
    loss.backward()
    optimizer.step()


def activation_memory(plugin: str, preset: str, batch: int, data: Path) -> dict:
    import torch

    from ddl.worker.build import activation_checkpointing
    from ddl.worker.observe.activation_memory import SavedTensorMeter

    row: dict = {"preset": preset, "batch": batch, "saved_for_backward_bytes": {}}
    for mode in activation_checkpointing.MODES:
        workload, sample = _workload_and_batch(plugin, preset, batch, data)
        torch.manual_seed(1)
        model = workload.build_model()
        activation_checkpointing.apply(workload.fsdp_units(model), mode)
        optimizer = workload.optimizer(list(model.parameters()), 1e-4)
        meter = SavedTensorMeter()
        start = time.perf_counter()
        with meter.measure():
            _step(workload, model, optimizer, sample)
        row["saved_for_backward_bytes"][mode] = meter.peak_bytes
        row.setdefault("step_time_s", {})[mode] = time.perf_counter() - start
    saved = row["saved_for_backward_bytes"]
    row["full_over_none"] = saved["full"] / saved["none"]
    row["selective_over_none"] = saved["selective"] / saved["none"]
    return row


def compile_ratio(plugin: str, preset: str, batch: int, data: Path, steps: int,
                  warmup: int) -> dict:
    import torch

    from ddl.worker.build import compiling

    row: dict = {"preset": preset, "batch": batch, "steps": steps, "warmup": warmup}
    before = compiling.compile_seconds() or 0.0  # the process's total so far
    for mode in ("eager", "compiled"):
        workload, sample = _workload_and_batch(plugin, preset, batch, data)
        torch.manual_seed(1)
        model = workload.build_model()
        if mode == "compiled":
            compiling.apply(workload.fsdp_units(model))
        optimizer = workload.optimizer(list(model.parameters()), 1e-4)
        start = time.perf_counter()
        for _ in range(warmup):  # compiles here (forward and backward graphs)
            _step(workload, model, optimizer, sample)
        row[f"{mode}_warmup_s"] = time.perf_counter() - start
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            _step(workload, model, optimizer, sample)
            times.append(time.perf_counter() - t0)
        row[f"{mode}_median_step_s"] = statistics.median(times)
    total = compiling.compile_seconds()
    row["compile_time_s"] = None if total is None else total - before
    row["compiled_over_eager"] = row["compiled_median_step_s"] / row["eager_median_step_s"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny presets, 1 timed step")
    parser.add_argument("--batch", type=int, default=2, help="samples per step (default 2)")
    parser.add_argument("--parts", default="memory,compile",
                        help="which measurements (default: memory,compile)")
    add_data_dir_flag(parser)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    given = given_data_dirs(parser, args.data_dir)
    parts = set(args.parts.split(","))
    import torch

    torch.set_num_threads(1)  # like one rank of a local run
    memory_cases = [("xsum", "tiny" if args.quick else "course"),
                    ("imagewoof", "tiny" if args.quick else "course")]
    compile_cases = [("mnist", "tiny"), ("xsum", "tiny")] if "compile" in parts else []
    steps, warmup = (1, 1) if args.quick else (5, 2)
    result: dict = {"benchmark": "block_options", "machine": describe(), "quick": args.quick,
                    "threads": 1, "activation_memory": {}, "compile": {}}
    with tempfile.TemporaryDirectory(prefix="ddl-block-options-") as tmp:
        data = {p: given[p] if p in given else _prepare(p, Path(tmp))
                for p in {"xsum", "imagewoof", *(c[0] for c in compile_cases)}}
        for plugin, preset in memory_cases:
            result["activation_memory"][plugin] = activation_memory(plugin, preset, args.batch,
                                                                    data[plugin])
            print(plugin, json.dumps(result["activation_memory"][plugin]), flush=True)
        for plugin, preset in compile_cases:
            result["compile"][plugin] = compile_ratio(plugin, preset, args.batch * 4,
                                                      data[plugin], steps, warmup)
            print(plugin, json.dumps(result["compile"][plugin]), flush=True)
    ratio = result["activation_memory"]["xsum"]["full_over_none"]
    result["goal"] = {"xsum_full_over_none_at_most": GOAL_FULL_OVER_NONE,
                      "met": ratio <= GOAL_FULL_OVER_NONE, "course_shape": not args.quick}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"block_options: xsum full/none {ratio:.3f} (goal <= {GOAL_FULL_OVER_NONE}); "
          f"{args.out}")
    return 0 if result["goal"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
