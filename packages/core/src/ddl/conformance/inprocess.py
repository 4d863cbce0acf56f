"""The kit's checks that run inside the calling process: the spec, the data, one batch
through the model, and the parallelism hints. No installation needed: they take a spec
(or the workload object made from one)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ddl.conformance.contracts import ContractBroken
from ddl.conformance.meta_build import assert_meta_build
from ddl.contract.specs import CAPABILITIES, WorkloadSpec
from ddl.contract.workload import SPLITS


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
    """``datasets``: the three splits, non-empty, each sample an (inputs, targets) pair
    (any sample that batches, for a workload whose to_device() makes the pair)."""
    from ddl.contract.workload import Workload

    pairs = type(workload).to_device is Workload.to_device
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
        _check_samples(splits[split], split, size, broken, pairs)
    return splits


def _sample_indices(size: int, every_up_to: int = 256, seed: int = 7) -> list[int]:
    """Every index of a small split; of a large one the first and last 8 and 16 at random
    (a ``__len__`` that counts samples that do not exist shows at the end)."""
    if size <= every_up_to:
        return list(range(size))
    import random

    ends = [*range(8), *range(size - 8, size)]
    return sorted(set(ends + random.Random(seed).sample(range(8, size - 8), 16)))


def _check_samples(dataset: Any, split: str, size: int, broken, pairs: bool) -> None:
    """Each checked sample reads, is an (inputs, targets) pair (if ``pairs``) and batches
    with sample 0 as the DataLoader would batch them (torch's default_collate)."""
    from torch.utils.data import default_collate

    first = None
    for index in _sample_indices(size):
        try:
            sample = dataset[index]
        except Exception as exc:
            raise broken(f"split {split!r} has len() {size} but sample {index} cannot be read: "
                         f"{type(exc).__name__}: {exc}") from exc
        if pairs and not (isinstance(sample, (tuple, list)) and len(sample) == 2):
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

    from ddl.worker.process.distributed import seed_all

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
    if "fsdp_units" in spec.capabilities:
        _check_fsdp_units(workload, model, spec.name)
    if "pipeline_splits" in spec.capabilities:
        _check_pipeline(workload, spec.name)
    if "tp_plan" in spec.capabilities:
        plan = workload.tp_plan(model)
        if not plan:
            raise ContractBroken("tp_plan", spec.name, "empty plan")
        modules = dict(model.named_modules())
        wrong = {p: s for p, s in plan.items() if not _plan_key_matches(p, modules) or s not in
                 ("colwise", "rowwise")}
        if wrong:
            raise ContractBroken("tp_plan", spec.name, f"bad entries {wrong}")


def _check_fsdp_units(workload: Any, model: Any, name: str) -> None:
    units = workload.fsdp_units(model)
    if not units:
        raise ContractBroken("fsdp_units", name, "fsdp_units() returned no modules")
    ids = {id(m) for m in model.modules()}
    strangers = [type(u).__name__ for u in units if id(u) not in ids or u is model]
    if strangers:
        raise ContractBroken("fsdp_units", name, f"{strangers} are not sub-modules "
                             "of the model build_model() returned")
    if len({id(u) for u in units}) != len(units):
        raise ContractBroken("fsdp_units", name, "a module is listed twice")


def _check_pipeline(workload: Any, name: str) -> None:
    """Split points (top-level children, for the default cut), then a cut into 2 stages
    whose parameters are the model's under the model's names."""
    from ddl.contract.workload import Workload

    def broken(detail: str) -> ContractBroken:
        return ContractBroken("pipeline_splits", name, detail)

    model = workload.build_model()
    splits = workload.pipeline_splits(model)
    if not splits:
        raise broken("no split points")
    default_cut = type(workload).pipeline_stages is Workload.pipeline_stages
    children = [n for n, _ in model.named_children()]
    unknown = [s for s in splits if s not in children]
    if default_cut and unknown:
        raise broken(f"{unknown} are not top-level children ({children}); the default "
                     "pipeline_stages cuts there (override pipeline_stages otherwise)")
    try:
        stages = list(workload.pipeline_stages(model, 2))
    except Exception as exc:
        raise broken(f"pipeline_stages(model, 2) raised {type(exc).__name__}: {exc}") from exc
    if len(stages) != 2:
        raise broken(f"pipeline_stages(model, 2) returned {len(stages)} stages, not 2")
    problem = stage_name_problem(model, stages)
    if problem:
        raise broken(problem)


def stage_name_problem(model: Any, stages: list[Any]) -> str | None:
    """What is wrong with the names under which ``stages`` hold ``model``'s parameters:
    a name the model lacks (or a tensor of another shape or value under it), a parameter
    no stage holds, or a weight the model uses under several names (a tied head) that
    stages hold under different ones (the pipeline would then train two copies). None
    when the stages' state dicts merge into the model's."""
    import torch

    own = dict(model.named_parameters(remove_duplicate=False))
    held = [dict(stage.named_parameters(remove_duplicate=False)) for stage in stages]
    for index, names in enumerate(held):
        for n, p in names.items():
            if n not in own or p.shape != own[n].shape or not torch.equal(p, own[n]):
                return (f"stage {index} holds {n!r}, which is not the model's parameter of "
                        "that name: stages must keep the full model's names")
    aliases: dict[int, set[str]] = {}  # the model's names of each of its parameters
    for n, p in own.items():
        aliases.setdefault(id(p), set()).add(n)
    for names in aliases.values():
        kept = [names & set(stage) for stage in held]
        holders = [i for i, k in enumerate(kept) if k]
        if not holders:
            return f"no stage holds {min(names)!r}"
        if len(holders) > 1 and not set.intersection(*(kept[i] for i in holders)):
            first = next(n for n in own if n in names)
            return (f"the weight {first!r} (tied: {', '.join(n for n in own if n in names)}) "
                    f"is held by stages {holders} under different names; give it one name "
                    "in every stage (the default cut cannot: override pipeline_stages)")
    return None


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
    assert_meta_build(workload.build_model, spec.name)
