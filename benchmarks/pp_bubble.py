"""Pipeline bubble: does ddl's measured idle fraction match (p-1)/(v*m+p-1)?

The theory holds when every stage costs the same and communication is free next to compute.
MNIST tiny is neither (0.86 measured against 0.20), so this benchmark builds the case the
theory describes: a chain of equal blocks, one per stage, whose hand-off between stages is
narrow (``boundary`` features). It runs through ddl's real pipeline strategy
(``ddl_strategies.shorthands.Pipeline``, ddl_strategies.pipeline: the stages, the schedule, the p2p
hand-offs, the
per-rank compute timers and ``report()``), only without the trainer around it, and writes
what ``report()`` says, per schedule and microbatch count, as JSON.

Two kinds of compute (``--compute``):

- ``matmul`` (default): wide Linear layers on the CPU, one thread per stage. Real, but on
  this 2-core VM one op's time varies by 10-20 % between steps and a hand-off waits for the
  OS to schedule gloo's thread next to a busy stage, so the bubble reads 10-40 % above theory.
  Results: ``benchmarks/results/pp_bubble.json``.
- ``accelerator``: every layer's forward holds the host thread for a fixed time and its
  backward for twice that, as a host waits for a GPU kernel; the CPU stays free for the
  hand-offs. Everything but the arithmetic is real. This is the balanced split of the
  theory, and what the 10 % acceptance bar is measured on (no GPU here).
  Results: ``benchmarks/results/pp_bubble-accelerator.json``.

    .venv/bin/python benchmarks/pp_bubble.py                 # matmul, GPipe and 1F1B, m = 4, 8
    .venv/bin/python benchmarks/pp_bubble.py --compute accelerator \
        --schedules gpipe 1f1b interleaved1f1b --microbatches 4 8

The first step of every run is not measured (pp.py leaves it out: it builds buffers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

RESULTS = {"matmul": Path(__file__).resolve().parent / "results" / "pp_bubble.json",
           "accelerator": Path(__file__).resolve().parent / "results"
           / "pp_bubble-accelerator.json"}


@dataclass(frozen=True)
class Settings:
    stages: int = 2
    width: int = 1024  # features of every Linear layer
    layers_per_stage: int = 4
    # samples per microbatch: large enough that one microbatch's compute (~0.1 s forward on
    # one core) dwarfs a point-to-point hand-off, even on a machine shared with other jobs
    # (at 64 samples a hand-off's wait for a busy core made the bubble read 0.6 for 0.2)
    microbatch: int = 1024
    steps: int = 4  # optimizer steps per run (the first is not measured)
    # features that cross a stage boundary: every block widens its input to ``width`` and
    # narrows it again at its end, so the hand-off between stages stays small next to the
    # compute, as the theory assumes (communication free); 0 means no narrowing
    boundary: int = 64
    # "matmul": stages compute on the CPU (real, but on a 2-core VM each op's time varies
    # by 10-20 % and a hand-off waits for the scheduler); "accelerator": each layer's
    # forward holds the host for a fixed time and its backward for twice that, the way a
    # host thread waits for a GPU kernel: the schedule, the p2p hand-offs, the autograd and
    # ddl's timers are all real, only the arithmetic is replaced by a known duration
    compute: str = "matmul"
    accelerator_forward_ms: float = 40.0  # per layer; backward takes twice as long
    # "DIR:N": N runs (separate invocations, accelerator compute) time their steps side by
    # side: after its unmeasured first step each waits until all N are there, so none is
    # timed while another is still importing torch (tests/distributed/test_pp_bubble.py)
    start_together: str = ""


def _toy_workload(settings: Settings):
    """A balanced chain as a ddl Workload: ``stages`` equal blocks, split between them."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from ddl.contract.workload import Workload

    class AcceleratorWait(torch.autograd.Function):
        """Identity whose forward and backward take a fixed time off the host's CPU."""

        @staticmethod
        def forward(ctx, x):
            time.sleep(settings.accelerator_forward_ms / 1000)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            time.sleep(2 * settings.accelerator_forward_ms / 1000)
            return grad

    class AcceleratorLayer(nn.Linear):
        def forward(self, x):
            return AcceleratorWait.apply(super().forward(x))

    class BalancedChain(Workload):
        def check_data(self, data_dir):
            pass

        def prepare(self, data_dir, *, synthetic):
            return data_dir

        def datasets(self, data_dir):
            return {}

        def build_model(self):
            def block():
                sizes = [settings.width] * (settings.layers_per_stage + 1)
                if settings.boundary:
                    sizes[0] = sizes[-1] = settings.boundary
                if settings.compute == "accelerator":  # a small layer; its time is fixed
                    return nn.Sequential(*[AcceleratorLayer(settings.boundary or 64,
                                                            settings.boundary or 64)
                                           for _ in range(settings.layers_per_stage)])
                return nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.ReLU())
                                       for a, b in zip(sizes, sizes[1:])])
            return nn.Sequential(OrderedDict((f"block{i}", block())
                                             for i in range(settings.stages)))

        def pipeline_splits(self, model):
            return [f"block{i}" for i in range(1, settings.stages)]

        def loss(self, outputs, targets):
            return F.mse_loss(outputs, targets)

        def sample_metrics(self, outputs, targets):
            return {"loss": ((outputs - targets) ** 2).mean(dim=1)}

        def optimizer(self, params, lr):
            return torch.optim.SGD(params, lr=lr)

    return BalancedChain(SimpleNamespace(options={}))


def _worker(rank: int, settings: Settings, schedule: str, microbatches: int, port: int,
            out: Path) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(settings.stages),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)  # one core per stage: stages must not compete for threads
    from ddl.contract.strategy import StrategyContext
    from ddl.worker.process import mesh
    from ddl.worker.process.distributed import init_world
    from ddl.worker.train.precision import Precision
    from ddl_strategies.pipeline import schedule_choice
    from ddl_strategies.shorthands import Pipeline

    world = init_world("cpu", "cpu", "gloo")
    strategy = Pipeline({"schedule": schedule, "bubble_steps": str(settings.steps)})
    # interleaved schedules hold v stages per rank: one equal block per stage
    v = schedule_choice(strategy.options)[1]
    workload = _toy_workload(replace(settings, stages=settings.stages * v))
    layout = strategy.resolve_layout({}, world.size)
    run_mesh, dp_mesh = mesh.build(layout, world)  # the worker's one mesh builder
    run = StrategyContext(world=world, layout=layout, workload=workload,
                          microbatches=microbatches, mesh=run_mesh,
                          dp_mesh=dp_mesh)  # as the trainer
    strategy.check(run)
    batch = microbatches * settings.microbatch
    strategy.check_layout(run, SimpleNamespace(batch_per_replica=batch, micro_batch=batch))
    torch.manual_seed(0)
    model = strategy.wrap(workload.build_model(), run)
    optimizer = workload.optimizer(model.parameters(), 1e-4)
    precision = Precision.create("fp32", world.device)
    generator = torch.Generator().manual_seed(1)
    cpu = 0.0
    for step in range(settings.steps):
        # requires_grad: the first stage then also computes its input's gradient, as every
        # later stage does; without it the first stage does less work and the split is uneven
        inputs = torch.randn(batch, settings.boundary or settings.width,
                             generator=generator).requires_grad_()
        before = time.process_time()
        optimizer.zero_grad(set_to_none=True)  # the trainer's step (ddl.worker.train.step)
        strategy.forward_backward(model, [(inputs, inputs)], run, precision)
        precision.step(optimizer)
        if step == 0 and settings.start_together:
            _wait_for_the_others(settings.start_together, rank)
        if step:  # the pipeline leaves the first step out as well
            cpu += time.process_time() - before
    report = strategy.report(model, run)
    # CPU seconds per busy second (matmul compute only): about 1 when each stage had a core
    # to itself; well below 1 means the process waited for a core while "computing" (other
    # jobs on the machine), and the bubble reads high
    pipe = model.pipeline  # ddl_strategies.pipeline.PipelineRunner: the stages' timing
    share = cpu / pipe.busy if pipe.busy else float("nan")
    report["cpu_per_busy_second_per_rank"] = [None] * world.size
    torch.distributed.all_gather_object(report["cpu_per_busy_second_per_rank"], share)
    report["busy_s_per_step"] = pipe.busy / max(pipe.measured, 1)
    if rank == 0:
        out.write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


def _wait_for_the_others(spec: str, rank: int, timeout_s: float = 120.0) -> None:
    """Rank 0 says it is ready (a file in DIR) and waits for N such files; then both ranks
    go on together. Polls every 10 ms: rank 0 then holds no core the others need."""
    import torch.distributed as dist

    folder, _, count = spec.rpartition(":")
    if rank == 0:
        Path(folder, f"ready-{os.getpid()}").touch()
        deadline = time.monotonic() + timeout_s
        while len(list(Path(folder).glob("ready-*"))) < int(count):
            if time.monotonic() > deadline:
                raise RuntimeError(f"--start-together {spec}: the others were not ready "
                                   f"within {timeout_s:g} s")
            time.sleep(0.01)
    dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(settings: Settings, schedule: str, microbatches: int, scratch: Path) -> dict:
    """One pipeline run on ``settings.stages`` local processes; pp.py's report."""
    import torch.multiprocessing as mp

    # Forked, not spawned, from a parent that has imported what the workers need (and run
    # no torch op, so no thread pool is copied half-made): a spawned worker imported torch
    # and ddl again, 2 of the 3 imports of each run, which made up most of the test's
    # start-up with three runs side by side on 2 cores (tests/distributed/test_pp_bubble.py).
    import ddl.worker.process.distributed  # noqa: F401
    import ddl_strategies.shorthands  # noqa: F401

    out = scratch / f"{schedule}-{microbatches}.json"
    start = time.perf_counter()
    mp.start_processes(_worker, args=(settings, schedule, microbatches, _free_port(), out),
                       nprocs=settings.stages, start_method="fork")
    report = json.loads(out.read_text())
    report["run_time_s"] = round(time.perf_counter() - start, 2)
    report["ratio"] = report["bubble_measured"] / report["bubble_theory"]
    return report


def run(settings: Settings, schedules: list[str], microbatches: list[int],
        scratch: Path) -> dict:
    rows = [measure(settings, s, m, scratch) for s in schedules for m in microbatches]
    return {"benchmark": "pp_bubble", "settings": asdict(settings),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "load_avg_1min": os.getloadavg()[0]},
            "runs": rows}


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    defaults = Settings()
    parser.add_argument("--width", type=int, default=defaults.width)
    parser.add_argument("--layers-per-stage", type=int, default=defaults.layers_per_stage)
    parser.add_argument("--microbatch", type=int, default=defaults.microbatch)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--boundary", type=int, default=defaults.boundary)
    parser.add_argument("--compute", choices=["matmul", "accelerator"],
                        default=defaults.compute)
    parser.add_argument("--accelerator-forward-ms", type=float,
                        default=defaults.accelerator_forward_ms)
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--microbatches", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--start-together", default="", metavar="DIR:N",
                        help="time the steps side by side with N-1 other invocations")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/pp_bubble"
                        "[-accelerator].json")
    ns = parser.parse_args(argv)
    settings = Settings(width=ns.width, layers_per_stage=ns.layers_per_stage,
                        microbatch=ns.microbatch, steps=ns.steps, boundary=ns.boundary,
                        compute=ns.compute,
                        accelerator_forward_ms=ns.accelerator_forward_ms,
                        start_together=ns.start_together)
    ns.out = ns.out or RESULTS[ns.compute]
    with tempfile.TemporaryDirectory() as scratch:
        results = run(settings, ns.schedules, ns.microbatches, Path(scratch))
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(results, indent=2) + "\n")
    for row in results["runs"]:
        print(f"{results['settings']['compute']:<11} {row['schedule']:<15} "
              f"m={row['microbatches']:<2} theory {row['bubble_theory']:.3f}  measured "
              f"{row['bubble_measured']:.3f} (ratio {row['ratio']:.2f}, per rank "
              f"{[round(x, 3) for x in row['bubble_measured_per_rank']]})")
    print(f"results: {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
