"""The conformance kit: checks that a workload plugin keeps ddl's workload contract.

Third-party plugin authors call these from their own test suite (pytest or not)::

    from ddl import conformance

    def test_my_workload_conforms(tmp_path):
        conformance.check_workload("mywork", tmp_path)

Each check raises :class:`ContractBroken` (an ``AssertionError``, so pytest reports it as a
failure) whose message names the broken contract, the workload, and what was found. The
checks that start processes (``ddp-equivalence``, ``strategy:<name>``) go through the real
``ddl train`` command line, so the workload must be installed (an entry point in group
``ddl``); the in-process checks also accept a spec that was never installed.

Contracts (the names the messages use):
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from ddl.contract.specs import CAPABILITIES, WorkloadSpec
from ddl.contract.workload import SPLITS

CONTRACTS = {
    "presets": "the spec has presets, its default preset is one of them, every preset has "
               "positive epochs, batch size and lr, and a `tiny` preset exists for CPU tests",
    "capabilities": "the spec declares only capabilities ddl knows",
    "data": "prepare(synthetic=True) writes data that check_data() accepts",
    "datasets": "datasets() returns non-empty train, val and test datasets of "
                "(inputs, targets) samples; every sample len() counts reads and batches "
                "with the first (all of a small split, ends and a random few of a large one)",
    "forward-backward": "a batch runs through forward() and loss() to a finite scalar whose "
                        "backward pass gives finite gradients to the parameters",
    "metrics": "sample_metrics() returns per-sample tensors including `loss`, whose mean "
               "equals loss()",
    "fsdp_units": "a workload declaring fsdp_units returns distinct sub-modules of its model",
    "pipeline_splits": "a workload declaring pipeline_splits names top-level children of "
                       "its model",
    "tp_plan": "a workload declaring tp_plan maps module paths of its model to "
               "'colwise' or 'rowwise'",
    "ddp-equivalence": "`ddl train` on 2 processes (DDP, gloo) ends with the weights of 1 "
                       "process at the same global batch",
    "strategy": "every strategy the workload's capabilities make it support trains a few "
                "steps on 2 processes through `ddl train`",
}
__doc__ += "".join(f"\n- ``{name}``: {text}." for name, text in CONTRACTS.items())

#: How the CLI checks run ddl: this interpreter, so a venv's plugins are the ones checked.
DDL_COMMAND = (sys.executable, "-c", "import sys; from ddl.commands.cli import main; sys.exit(main())")
STEPS = ("--epochs", "1", "--steps-per-epoch", "3", "--seed", "7")


class ContractBroken(AssertionError):
    """A workload broke a named contract of :data:`CONTRACTS`."""

    def __init__(self, contract: str, workload: str, detail: str) -> None:
        self.contract, self.workload, self.detail = contract, workload, detail
        rule = CONTRACTS[contract.split(":")[0]]
        super().__init__(f"workload {workload!r} breaks contract {contract!r}: {detail} "
                         f"(the contract: {rule})")


# --- in-process checks ----------------------------------------------------------------------

def check_spec(spec: WorkloadSpec) -> None:
    """``presets`` and ``capabilities``: the registration data alone, no torch needed."""
    def broken(detail: str) -> ContractBroken:
        return ContractBroken("presets", spec.name, detail)

    if not spec.presets:
        raise broken("no presets")
    if spec.default_preset not in spec.presets:
        raise broken(f"default preset {spec.default_preset!r} is not among the presets "
                     f"({', '.join(spec.presets)})")
    for key, preset in spec.presets.items():
        if preset.name != key:
            raise broken(f"preset registered as {key!r} calls itself {preset.name!r}")
        for field in ("epochs", "batch_size", "lr"):
            value = getattr(preset, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise broken(f"preset {key!r} has {field}={value!r}")
    if "tiny" not in spec.presets:
        raise broken("no `tiny` preset (the kit and CPU tests train it)")
    unknown = sorted(set(spec.capabilities) - set(CAPABILITIES))
    if unknown:
        raise ContractBroken("capabilities", spec.name,
                             f"unknown {', '.join(unknown)}; allowed: {', '.join(CAPABILITIES)}")


def check_data(spec: WorkloadSpec, data_dir: Path, preset: str = "tiny") -> Any:
    """``data``: generate the synthetic set unless present, then check_data() must pass.
    Returns the workload object for the next checks."""
    from ddl.contract.errors import DataMissing

    workload = spec.create(spec.presets[preset])
    data_dir = Path(data_dir)
    try:
        workload.check_data(data_dir)
    except DataMissing:
        try:
            workload.prepare(data_dir, synthetic=True)
            workload.check_data(data_dir)
        except Exception as exc:
            raise ContractBroken("data", spec.name, f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise ContractBroken("data", spec.name, f"check_data() on fresh data: "
                             f"{type(exc).__name__}: {exc}") from exc
    return workload


def check_datasets(workload: Any, data_dir: Path, name: str) -> dict[str, Any]:
    """``datasets``: the three splits, non-empty, each sample an (inputs, targets) pair."""
    def broken(detail: str) -> ContractBroken:
        return ContractBroken("datasets", name, detail)

    try:
        splits = workload.datasets(Path(data_dir))
    except Exception as exc:
        raise broken(f"datasets() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(splits, dict):
        raise broken(f"datasets() returned {type(splits).__name__}, not a dict")
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        raise broken(f"split(s) {', '.join(missing)} missing (got {', '.join(splits) or 'none'})")
    for split in SPLITS:
        try:
            size = len(splits[split])
        except Exception as exc:
            raise broken(f"len() of split {split!r}: {type(exc).__name__}: {exc}") from exc
        if size == 0:
            raise broken(f"split {split!r} is empty")
        _check_samples(splits[split], split, size, broken)
    return splits


def _sample_indices(size: int, every_up_to: int = 256, seed: int = 7) -> list[int]:
    """Every index of a small split; of a large one the first and last 8 and 16 at random
    (a ``__len__`` that counts samples that do not exist shows at the end)."""
    if size <= every_up_to:
        return list(range(size))
    import random

    ends = [*range(8), *range(size - 8, size)]
    return sorted(set(ends + random.Random(seed).sample(range(8, size - 8), 16)))


def _check_samples(dataset: Any, split: str, size: int, broken) -> None:
    """Each checked sample reads, is an (inputs, targets) pair and batches with sample 0 as
    the DataLoader would batch them (torch's default_collate)."""
    from torch.utils.data import default_collate

    first = None
    for index in _sample_indices(size):
        try:
            sample = dataset[index]
        except Exception as exc:
            raise broken(f"split {split!r} has len() {size} but sample {index} cannot be read: "
                         f"{type(exc).__name__}: {exc}") from exc
        if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
            raise broken(f"split {split!r} sample {index} is {type(sample).__name__}, "
                         "not an (inputs, targets) pair")
        if first is None:
            first = sample
            continue
        try:
            default_collate([first, sample])
        except Exception as exc:
            raise broken(f"split {split!r} sample {index} does not batch with sample 0 "
                         f"(len() says {size} samples): {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc


def check_model(workload: Any, dataset: Any, name: str, batch_size: int = 4) -> None:
    """``forward-backward`` and ``metrics`` on one batch of ``dataset`` (on the CPU)."""
    import torch
    from torch.utils.data import DataLoader

    from ddl.worker.distributed import seed_all

    seed_all(7)
    try:
        model = workload.build_model()
        batch = next(iter(DataLoader(dataset, batch_size=min(batch_size, len(dataset)))))
        inputs, targets = workload.to_device(batch, torch.device("cpu"))
        outputs = workload.forward(model, inputs)
        loss = workload.loss(outputs, targets)
    except Exception as exc:
        raise ContractBroken("forward-backward", name,
                             f"{type(exc).__name__}: {exc}") from exc
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ContractBroken("forward-backward", name, f"loss() gave {shape}, not a scalar")
    if not torch.isfinite(loss):
        raise ContractBroken("forward-backward", name, f"loss is {loss.item()}")
    try:
        loss.backward()
    except Exception as exc:
        raise ContractBroken("forward-backward", name,
                             f"backward: {type(exc).__name__}: {exc}") from exc
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    if not grads or all(g is None for g in grads.values()):
        raise ContractBroken("forward-backward", name, "no parameter received a gradient")
    bad = [n for n, g in grads.items() if g is not None and not torch.isfinite(g).all()]
    if bad:
        raise ContractBroken("forward-backward", name, f"non-finite gradients in {bad[:3]}")

    with torch.no_grad():
        try:
            metrics = workload.sample_metrics(outputs.detach(), targets)
        except Exception as exc:
            raise ContractBroken("metrics", name, f"{type(exc).__name__}: {exc}") from exc
        if "loss" not in metrics:
            raise ContractBroken("metrics", name, f"no `loss` among {sorted(metrics)}")
        n = len(targets) if not isinstance(targets, torch.Tensor) else targets.shape[0]
        for key, value in metrics.items():
            if not (isinstance(value, torch.Tensor) and tuple(value.shape) == (n,)):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else value
                raise ContractBroken("metrics", name,
                                     f"{key!r} has shape {shape}, expected ({n},)")
        mean = metrics["loss"].double().mean().item()
        if not math.isclose(mean, loss.item(), rel_tol=1e-4, abs_tol=1e-6):
            raise ContractBroken("metrics", name, f"mean per-sample loss {mean:.6g} != "
                                 f"loss() {loss.item():.6g}")


def check_hints(spec: WorkloadSpec, workload: Any) -> None:
    """``fsdp_units``, ``pipeline_splits``, ``tp_plan``: each declared hint is usable."""
    model = workload.build_model()
    modules = dict(model.named_modules())
    ids = {id(m) for m in modules.values()}
    if "fsdp_units" in spec.capabilities:
        units = workload.fsdp_units(model)
        if not units:
            raise ContractBroken("fsdp_units", spec.name, "fsdp_units() returned no modules")
        strangers = [type(u).__name__ for u in units if id(u) not in ids or u is model]
        if strangers:
            raise ContractBroken("fsdp_units", spec.name, f"{strangers} are not sub-modules "
                                 "of the model build_model() returned")
        if len({id(u) for u in units}) != len(units):
            raise ContractBroken("fsdp_units", spec.name, "a module is listed twice")
    if "pipeline_splits" in spec.capabilities:
        splits = workload.pipeline_splits(model)
        children = [n for n, _ in model.named_children()]
        if not splits:
            raise ContractBroken("pipeline_splits", spec.name, "no split points")
        unknown = [s for s in splits if s not in children]
        if unknown:
            raise ContractBroken("pipeline_splits", spec.name,
                                 f"{unknown} are not top-level children ({children})")
    if "tp_plan" in spec.capabilities:
        plan = workload.tp_plan(model)
        if not plan:
            raise ContractBroken("tp_plan", spec.name, "empty plan")
        wrong = {p: s for p, s in plan.items() if not _plan_key_matches(p, modules) or s not in
                 ("colwise", "rowwise")}
        if wrong:
            raise ContractBroken("tp_plan", spec.name, f"bad entries {wrong}")


def _plan_key_matches(pattern: str, modules: dict) -> bool:
    """Whether a tp_plan key names a sub-module, read as torch's parallelize_module reads it:
    dot-separated parts, each an fnmatch pattern for one level (``blocks.*.attn.q``)."""
    from fnmatch import fnmatch

    parts = pattern.split(".")
    return any(len(path.split(".")) == len(parts)
               and all(fnmatch(name, part) for name, part in zip(path.split("."), parts))
               for path in modules if path)


def check_in_process(spec: WorkloadSpec, data_dir: Path, preset: str = "tiny") -> None:
    """Every check that runs inside this process (no installation needed)."""
    check_spec(spec)
    workload = check_data(spec, data_dir, preset)
    splits = check_datasets(workload, data_dir, spec.name)
    check_model(workload, splits["train"], spec.name)
    check_hints(spec, workload)


# --- checks through the real command line ---------------------------------------------------

def _ddl(command: tuple[str, ...], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


def _train(command, contract, name, run_dir: Path, *args: str) -> dict:
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
    return results


def check_ddp_equivalence(name: str, data_dir: Path, work_dir: Path, preset: str = "tiny",
                          *, global_batch: int = 16, rtol: float = 1e-5,
                          command: tuple[str, ...] = DDL_COMMAND) -> None:
    """``ddp-equivalence``: 3 steps on 1 and on 2 processes, same seed and global batch."""
    import torch

    weights = {}
    for nproc in (1, 2):
        run_dir = Path(work_dir) / f"equivalence-{nproc}"
        _train(command, "ddp-equivalence", name, run_dir, "--preset", preset, "--strategy",
               "ddp", "--nproc", str(nproc), "--global-batch-size", str(global_batch),
               "--data-dir", str(data_dir), *STEPS)
        weights[nproc] = torch.load(run_dir / "model.pt", weights_only=True)
    one, two = weights[1], weights[2]
    if one.keys() != two.keys():
        raise ContractBroken("ddp-equivalence", name, "the two runs saved different tensors")
    for key in one:
        if not torch.allclose(two[key].double(), one[key].double(), rtol=rtol, atol=rtol * 0.1):
            diff = (two[key].double() - one[key].double()).abs().max().item()
            raise ContractBroken("ddp-equivalence", name, f"{key} differs by up to {diff:.3g} "
                                 f"(relative tolerance {rtol})")


def supported_strategies(spec: WorkloadSpec, plugins: Any = None) -> list[str]:
    """The installed strategies whose requirements the workload's capabilities meet."""
    from ddl.contract.plugins import Plugins

    strategies = (plugins or Plugins()).strategies()
    return [s for s, strategy in strategies.items() if strategy.supports(spec)]


def check_strategies(name: str, data_dir: Path, work_dir: Path, strategies: list[str],
                     preset: str = "tiny", *, command: tuple[str, ...] = DDL_COMMAND) -> None:
    """``strategy:<name>``: each strategy trains 3 steps on 2 processes."""
    for strategy in strategies:
        run_dir = Path(work_dir) / f"strategy-{strategy.replace('+', '-')}"
        _train(command, f"strategy:{strategy}", name, run_dir, "--preset", preset,
               "--strategy", strategy, "--nproc", "2", "--data-dir", str(data_dir), *STEPS)


def check_workload(name: str, work_dir: Path, preset: str = "tiny", *,
                   strategies: list[str] | None = None, plugins: Any = None,
                   command: tuple[str, ...] = DDL_COMMAND) -> None:
    """The whole kit for an installed workload: in-process checks, then DDP equivalence and
    each supported strategy (default: every one ``ddl plugins`` marks as supported) through
    ``ddl train``. ``work_dir`` receives the synthetic data and the run directories."""
    from ddl.contract.plugins import Plugins

    plugins = plugins or Plugins()
    spec = plugins.workload(name)
    work_dir = Path(work_dir)
    data_dir = work_dir / "data"
    check_in_process(spec, data_dir, preset)
    check_ddp_equivalence(name, data_dir, work_dir, preset, command=command)
    chosen = supported_strategies(spec, plugins) if strategies is None else strategies
    check_strategies(name, data_dir, work_dir, [s for s in chosen if s != "ddp"], preset,
                     command=command)
