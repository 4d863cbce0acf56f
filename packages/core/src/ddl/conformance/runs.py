"""The kit's checks through the real `ddl train`: one process as the reference, then every
strategy the workload supports at its smallest world, final weights compared per tensor.

Each run is 3 optimizer steps of the ``tiny`` preset at the same seed and global batch
(gloo on the CPU), evaluated on one global batch of each split (:data:`STEPS`) and, except
the run the resume check continues, writing no checkpoint. Launches are the cost, so each
layout runs once at the fewest processes that exercise it: 2, or 4 where a layout needs two
degrees above 1 (``fsdp+tp``: at 2 processes it is tensor parallel alone, dp = 1; the
``mesh`` run). The runs beyond one per strategy (HSDP, 3-D, degrees, accumulation,
clipping, resume) are planned in ddl.conformance.checks.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddl.conformance.contracts import ContractBroken
from ddl.conformance.tolerance import Tolerance, mismatches, relative_difference

#: How the checks run ddl: this interpreter, so a venv's plugins are the ones checked.
DDL_COMMAND = (sys.executable, "-c", "import sys; from ddl.commands.cli import main; sys.exit(main())")
GLOBAL_BATCH = 16
#: Every run's length, seed and evaluation: validation and test on the first GLOBAL_BATCH
#: samples of each split, one batch shared out over the replicas as training shares one (no
#: padding on any layout). The kit only asks that the final validation loss be finite; the
#: whole split took longer than the 3 steps (MNIST's tiny: 0.11 s against 0.04 s).
STEPS = ("--epochs", "1", "--steps-per-epoch", "3", "--seed", "7",
         "--eval-samples", str(GLOBAL_BATCH))
#: For the runs whose checkpoints no check reads (all but the one the resume check continues).
_NO_CHECKPOINTS = ("--keep-checkpoints", "0")
LAUNCH_TIMEOUT_S = 900

#: Where to look when a strategy ends elsewhere than one process: the hooks it uses.
SUSPECTS = {
    "ddp": "loss() must be the batch mean, the model must not depend on the rank (BatchNorm: "
           "--sync-bn)",
    "fsdp": "fsdp_units (a unit's parameters must be used inside its forward)",
    "tp": "prepare_tensor_parallel / tp_plan",
    "pp": "pipeline_stages / pipeline_splits (stages keep the full model's names, a tied "
          "weight one name in every stage)",
}


@dataclass(frozen=True)
class Run:
    """One run: ``label`` names it in failures (``strategy:<label>``). ``reference``: what
    the one-process run it is compared with needs beyond the common flags (clipping's
    ``--clip-grad-norm``); ``resumes``: the label of the run whose checkpoint after step
    :data:`RESUME_STEP` this one continues."""

    label: str
    nproc: int
    args: tuple[str, ...]
    suspects: str
    reference: tuple[str, ...] = ()
    resumes: str = ""


RESUME_STEP = 2  # of the 3 steps: the resumed run trains the last one


def strategy_runs(strategies: list[str], capabilities: frozenset[str] | set[str]) -> list[Run]:
    """One run per strategy, at the fewest processes that exercise it. ``mesh`` becomes the
    layout the hints allow beyond the shorthands (pp x tp, pp x FSDP or replicas x tp);
    without tp or pp hints it has no run of its own (ddl.conformance.checks says so)."""
    tp, pp = "tp_plan" in capabilities, "pipeline_splits" in capabilities
    runs = []
    for strategy in strategies:
        if strategy == "mesh":
            mesh = ("pp=2,tp=2" if tp and pp else "pp=2,dp_shard=2" if pp else
                    "dp_replicate=2,tp=2" if tp else None)
            if mesh:
                dims = [d.split("=")[0] for d in mesh.split(",")]
                runs.append(Run(f"mesh {mesh}", 4, ("--mesh", mesh), suspects_of(dims)))
            continue
        nproc = 4 if strategy == "fsdp+tp" else 2
        runs.append(Run(strategy, nproc, ("--strategy", strategy),
                        suspects_of(strategy.split("+"))))
    return runs


def suspects_of(parts: list[str]) -> str:
    """The hooks to check when a run of these strategies or mesh dimensions fails."""
    names = {"dp_shard": "fsdp", "dp_replicate": "ddp", "accelerate": "ddp"}
    return "; ".join(dict.fromkeys(SUSPECTS.get(names.get(p, p), SUSPECTS["ddp"])
                                   for p in parts))


def _ddl(command: tuple[str, ...], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A `ddl` command in a process group of its own (a timeout ends its workers too), one
    intra-op thread per process as every rank of a multi-process run has: a single process
    on more threads sums differently, which a 1e-5 comparison can see."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*command, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\ntimed out after {LAUNCH_TIMEOUT_S} s"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def train(command: tuple[str, ...], contract: str, name: str, run_dir: Path,
          *args: str) -> dict[str, Any]:
    """`ddl train` into ``run_dir``; returns the final weights (model.pt)."""
    import torch

    proc = _ddl(command, "train", "--plugin", name, "--run-dir", str(run_dir), *args,
                cwd=run_dir.parent)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ContractBroken(contract, name, f"`ddl train {' '.join(args)}` exited "
                             f"{proc.returncode}: {tail}")
    results = json.loads((run_dir / "results.json").read_text())
    loss = results["final"]["val"]["loss"]
    if not math.isfinite(loss):
        raise ContractBroken(contract, name, f"final validation loss is {loss}")
    return torch.load(run_dir / "model.pt", weights_only=True)


def compare(run: Run, name: str, got: dict, want: dict, tolerance: Tolerance,
            noise: dict | None = None) -> None:
    """ContractBroken naming the strategy, the tensor furthest off, how far, and what to
    check. ``noise``: a noise reference's weights (ddl.conformance.tolerance)."""
    contract = f"strategy:{run.label}"
    if got.keys() != want.keys():
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        raise ContractBroken(contract, name, f"model.pt holds other tensors than one "
                             f"process's (missing {missing[:3]}, extra {extra[:3]}): check "
                             f"{run.suspects}")
    wrong = mismatches(got, want, tolerance, noise)
    if wrong:
        # furthest off first: a wrong hint moves nearly every tensor, a list of 3 shows
        # where (a wrong head count: the embeddings and the attention projections)
        off = sorted(((relative_difference(got[t], want[t]), t, why) for t, why in wrong),
                     reverse=True)
        (worst, tensor, why), others = off[0], off[1:3]
        also = "".join(f", {t!r} by {100 * r:.3g} %" for r, t, _ in others)
        more = f" and {len(off) - 3} more tensor(s)" if len(off) > 3 else ""
        raise ContractBroken(contract, name, f"{tensor!r} differs from one process by "
                             f"{100 * worst:.3g} % ({why}; {tolerance.describe()}){also}"
                             f"{more}: check {run.suspects}")


def check_equivalence(name: str, data_dir: Path, work_dir: Path, runs: list[Run],
                      tolerance: Tolerance, preset: str = "tiny", *,
                      global_batch: int = GLOBAL_BATCH, parallel: int = 2,
                      command: tuple[str, ...] = DDL_COMMAND, noise: bool = True) -> None:
    """``strategy:<label>``: one process, then each of ``runs``, at the same global batch;
    up to ``parallel`` launches at a time (a launch waits on start-up and rendezvous as
    much as it computes). The first failure in ``runs`` order is raised."""
    results = equivalence_results(name, data_dir, work_dir, runs, tolerance, preset,
                                  global_batch=global_batch, parallel=parallel,
                                  command=command, noise=noise)
    with closing(results):  # on a failure, the launches still running finish first
        for _, failure in results:
            if failure is not None:
                raise failure


def equivalence_results(name: str, data_dir: Path, work_dir: Path, runs: list[Run],
                        tolerance: Tolerance, preset: str = "tiny", *,
                        global_batch: int = GLOBAL_BATCH, parallel: int = 2,
                        command: tuple[str, ...] = DDL_COMMAND, noise: bool = True
                        ) -> Iterator[tuple[Run | None, ContractBroken | None]]:
    """What check_equivalence checks, one result at a time: ``(None, failure)`` for the
    one-process reference (nothing follows a failed one), then ``(run, failure)`` per run
    in ``runs`` order, ``failure`` None where it passed. A run with a ``reference`` of its
    own is compared with one process given those flags too; a run that ``resumes``
    another starts when that one has ended. Relative directories are read from the
    current one (the launches run elsewhere). ``noise``: also train one process over the
    same global batch in :data:`NOISE_MICROBATCHES` micro-batches, the noise reference
    whose distance from one process may raise each tensor's bound
    (ddl.conformance.tolerance); False for a model where that is not the same computation
    (:func:`micro_batching_is_equivalent`)."""
    data_dir, work_dir = Path(data_dir).resolve(), Path(work_dir).resolve()
    common = ("--preset", preset, "--global-batch-size", str(global_batch),
              "--data-dir", str(data_dir), *STEPS)
    continued = {run.resumes for run in runs if run.resumes}  # their checkpoints are read

    def reference(extra: tuple[str, ...]) -> dict:
        where = "one-process" + "".join(f"-{_slug(a)}" for a in extra)
        return train(command, "strategy:one process", name, work_dir / where, "--nproc", "1",
                     *extra, *_NO_CHECKPOINTS, *common)

    def launch(run: Run, resumed: Future | None) -> dict:
        contract, args = f"strategy:{run.label}", (*run.args, "--nproc", str(run.nproc))
        if run.label not in continued:
            args += _NO_CHECKPOINTS
        if resumed is not None:
            try:
                resumed.result()
            except ContractBroken:
                raise ContractBroken(contract, name, f"not run: the run it resumes "
                                     f"({run.resumes}) failed") from None
            args += ("--resume", str(_run_dir(work_dir, run.resumes) / "checkpoints" /
                                     f"step-{RESUME_STEP:08d}"))
        weights = train(command, contract, name, _run_dir(work_dir, run.label), *args, *common)
        _check_clipping_bound(contract, name, _run_dir(work_dir, run.label), run.args)
        return weights

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        references = {extra: pool.submit(reference, extra)
                      for extra in dict.fromkeys([(), *(r.reference for r in runs)])}
        cut = ("--batch-size", str(global_batch // NOISE_MICROBATCHES))
        noisy = pool.submit(reference, cut) if noise else None
        launched: dict[str, Future] = {}
        for run in runs:  # a resumed run's own comes first in ``runs``: no wait on a queue
            launched[run.label] = pool.submit(launch, run, launched.get(run.resumes))
        try:
            try:
                references[()].result()
            except ContractBroken as exc:
                yield None, exc
                return
            yield None, None
            for run in runs:
                try:
                    compare(run, name, launched[run.label].result(),
                            _reference_of(run, name, references), tolerance,
                            _noise(noisy) if not run.reference else None)
                except ContractBroken as exc:
                    yield run, exc
                else:
                    yield run, None
        finally:
            for future in [*references.values(), *launched.values(), *filter(None, [noisy])]:
                future.cancel()  # launches not yet started; running ones finish


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def _run_dir(work_dir: Path, label: str) -> Path:
    return work_dir / f"strategy-{_slug(label)}"


NOISE_MICROBATCHES = 4  # as finely as the kit's runs cut a batch (4 ranks or micro-batches)


def micro_batching_is_equivalent(model: Any) -> bool:
    """Whether training ``model`` on a batch in micro-batches is the same computation
    (up to summation order): not when a layer normalises over the batch (BatchNorm,
    ghost BatchNorm included), whose statistics would then come from fewer samples."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return not any(isinstance(m, _BatchNorm) for m in model.modules())


def _noise(noisy: Future | None) -> dict | None:
    """The noise reference's weights; None when it was not run or failed (a broken
    accumulation is the ``accumulation`` check's to report, and the rule's own bound
    holds then)."""
    if noisy is None:
        return None
    try:
        return noisy.result()
    except ContractBroken:
        return None


def _reference_of(run: Run, name: str, references: dict[tuple[str, ...], Future]) -> dict:
    try:
        return references[run.reference].result()
    except ContractBroken as exc:  # a reference of its own: its failure is this check's
        raise ContractBroken(f"strategy:{run.label}", name, f"one process with "
                             f"{' '.join(run.reference)}: {exc.detail}") from None


def _check_clipping_bound(contract: str, name: str, run_dir: Path, args: tuple[str, ...]
                          ) -> None:
    """A clipping check that never clipped checked nothing: the norm before clipping (each
    epoch's mean, results.json) must exceed the limit."""
    if "--clip-grad-norm" not in args:
        return
    limit = float(args[args.index("--clip-grad-norm") + 1])
    epochs = json.loads((run_dir / "results.json").read_text())["epochs"]
    norms = [e["grad_norm"] for e in epochs if e.get("grad_norm") is not None]
    if not norms or min(norms) <= limit:
        raise ContractBroken(contract, name, f"--clip-grad-norm {limit:g} did not bind "
                             f"(gradient norms before clipping: {norms}): nothing was checked")
