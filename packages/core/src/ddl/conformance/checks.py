"""Which runs the kit makes, and which it cannot make and why.

Beyond one run per strategy (ddl.conformance.runs.strategy_runs) the kit checks what ddl
composes from ``--mesh`` and the training features every strategy must keep, each against
one process by the same tolerance rule:

- ``hsdp``: ``--mesh dp_replicate=2,dp_shard=2`` on 4 processes (replicas of FSDP shards);
- ``3d``: ``--mesh pp=2,tp=2,dp_shard=2`` on 8, for a workload with tp and pp hints;
- ``degrees``: ``tp=4`` and ``pp=4`` on 4, where the model allows (asked of the workload's
  ``prepare_tensor_parallel`` / ``pipeline_stages`` on a meta-device model);
- ``accumulation``: 2 micro-batches per optimizer step (``--batch-size`` half of what each
  replica gets of the global batch) on 2;
- ``clipping``: ``--clip-grad-norm`` small enough to bind, against one process clipping;
- ``resume``: a second run continues the first one's checkpoint after step 2 and must end
  where one process ends.

A layout check runs under the first selected strategy whose ``--mesh`` takes its dimensions
(``mesh`` composes any); the features under ``fsdp`` where selected (sharded gradients are
where accumulation, norms and checkpoints go wrong), else ``ddp``, ``mesh``, or the first
selected. What cannot run is a :class:`Skipped` with its reason, never left out silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddl.conformance.runs import GLOBAL_BATCH, RESUME_STEP, Run, strategy_runs, suspects_of

#: Everything the kit can run, in this order; ``strategies``: one run per strategy.
CHECKS = ("strategies", "hsdp", "3d", "degrees", "accumulation", "clipping", "resume")
CLIP_GRAD_NORM = 0.05  # gradient norms of the tiny presets start near 1: it binds
LAYOUTS = {  # check: (label, processes, --mesh, capabilities it needs)
    "hsdp": ("hsdp dp_replicate=2,dp_shard=2", 4, "dp_replicate=2,dp_shard=2", ()),
    "3d": ("3-D pp=2,tp=2,dp_shard=2", 8, "pp=2,tp=2,dp_shard=2",
           ("tp_plan", "pipeline_splits")),
    "tp=4": ("tp=4", 4, "tp=4", ("tp_plan",)),
    "pp=4": ("pp=4", 4, "pp=4", ("pipeline_splits",)),
}
FEATURE_SUSPECTS = {
    "accumulation": "train_steps (each micro-batch's loss divided by their number, gradients "
                    "synchronised on the last only); loss() must be the batch mean",
    "clipping": "clip_gradients (one norm over the whole model: every shard counted once)",
    "resume": "checkpoint_state / load_checkpoint_state (model and optimizer state)",
}
BASE_PREFERENCE = ("fsdp", "ddp", "mesh")


class NotChecked(UserWarning):
    """Warned by check_workload / check_strategies for each check they could not run."""


@dataclass(frozen=True)
class Skipped:
    """A check the kit did not run, and why (one line of ``ddl check-plugin``)."""

    label: str
    reason: str


@dataclass(frozen=True)
class CheckSchedule:
    """The kit's runs for the chosen checks, and the checks it cannot run (with why)."""

    runs: list[Run]
    skipped: list[Skipped] = field(default_factory=list)


#: The former name of :class:`CheckSchedule` (public in ``ddl.conformance``), kept as an alias.
Plan = CheckSchedule


def plan_checks(strategies: list[str], capabilities: frozenset[str] | set[str], *,
                checks: list[str] | tuple[str, ...] | None = None,
                mesh_dims: dict[str, frozenset[str]] | None = None,
                degrees: dict[str, str | None] | None = None) -> CheckSchedule:
    """The runs for ``checks`` (default: all of :data:`CHECKS`) of the selected
    ``strategies``. ``mesh_dims``: the ``--mesh`` dimensions each strategy takes
    (:func:`strategy_mesh_dims`; default: ``mesh`` takes all, the others none).
    ``degrees``: why ``tp=4`` / ``pp=4`` cannot run, None where they can
    (:func:`degree_problems`; default: not asked, so not run)."""
    from ddl.contract.errors import UsageError

    chosen = list(CHECKS if checks is None else checks)
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown:
        raise UsageError(f"checks: unknown {', '.join(unknown)}; allowed: {', '.join(CHECKS)}")
    dims = mesh_dims if mesh_dims is not None else {"mesh": frozenset(
        {"pp", "tp", "dp_replicate", "dp_shard"})}
    runs: list[Run] = []
    skipped: list[Skipped] = []
    if "strategies" in chosen:
        runs += strategy_runs(strategies, capabilities)
        if "mesh" in strategies and not {"tp_plan", "pipeline_splits"} & set(capabilities):
            skipped.append(Skipped("mesh", "no run of its own: without tp_plan or "
                                   "pipeline_splits its layouts are data parallel (the ddp, "
                                   "fsdp and hsdp checks)"))
    layouts = [c for c in ("hsdp", "3d") if c in chosen]
    layouts += ["tp=4", "pp=4"] if "degrees" in chosen else []
    for check in layouts:
        made = _layout_run(check, strategies, capabilities, dims, degrees)
        (runs if isinstance(made, Run) else skipped).append(made)
    features = [c for c in ("accumulation", "clipping", "resume") if c in chosen]
    base = next((s for s in BASE_PREFERENCE if s in strategies), strategies[0] if strategies
                else None)
    if features and base is None:
        skipped += [Skipped(c, "no strategy selected") for c in features]
    elif features:
        runs = _with_features(runs, base, capabilities, features)
    return CheckSchedule(runs, skipped)


def plan_runs(strategies: list[str], capabilities: frozenset[str] | set[str],
              **selection: Any) -> list[Run]:
    """The runs of :func:`plan_checks` (same arguments), without the ones it cannot make."""
    return plan_checks(strategies, capabilities, **selection).runs


def _layout_run(check: str, strategies: list[str], capabilities, dims, problems
                ) -> Run | Skipped:
    label, nproc, mesh, needs = LAYOUTS[check]
    lacking = [c for c in needs if c not in capabilities]
    if lacking:
        return Skipped(label, f"the workload declares no {' and no '.join(lacking)}")
    if check in ("tp=4", "pp=4"):
        problem = "the workload was not asked" if problems is None else problems.get(check)
        if problem:
            return Skipped(label, problem)
    wanted = [d.split("=")[0] for d in mesh.split(",")]
    runner = next((s for s in strategies if set(wanted) <= dims.get(s, frozenset())), None)
    if runner is None:
        return Skipped(label, f"no selected strategy takes --mesh {mesh} "
                              "(select mesh)")
    return Run(label, nproc, ("--strategy", runner, "--mesh", mesh),
               suspects_of(wanted))


def _with_features(runs: list[Run], base: str, capabilities, features: list[str]) -> list[Run]:
    """The feature runs under ``base``; with ``resume``, base's own run writes the
    checkpoint it continues (and is added if the strategies were not selected)."""
    own = next((r for r in runs if r.label == base), None) or strategy_runs([base],
                                                                            capabilities)[0]
    if "resume" in features:
        own = Run(own.label, own.nproc, (*own.args, "--checkpoint-every", str(RESUME_STEP)),
                  own.suspects)
    runs = [own if r.label == base else r for r in runs]
    if own not in runs:
        runs.insert(0, own)
    args = ("--strategy", base)
    extra = {
        # a quarter of the global batch per forward: 2 micro-steps on 2 replicas
        "accumulation": Run(f"accumulation ({base})", own.nproc,
                            (*args, "--batch-size", str(GLOBAL_BATCH // 4)),
                            FEATURE_SUSPECTS["accumulation"]),
        "clipping": Run(f"clipping ({base})", own.nproc,
                        (*args, "--clip-grad-norm", str(CLIP_GRAD_NORM)),
                        FEATURE_SUSPECTS["clipping"],
                        reference=("--clip-grad-norm", str(CLIP_GRAD_NORM))),
        "resume": Run(f"resume ({base})", own.nproc, (*args, "--checkpoint-every",
                                                      str(RESUME_STEP)),
                      FEATURE_SUSPECTS["resume"], resumes=base),
    }
    return runs + [extra[f] for f in features]


def strategy_mesh_dims(plugins: Any, names: list[str]) -> dict[str, frozenset[str]]:
    """The ``--mesh`` dimensions each named strategy takes (``dp`` read as its
    ``dp_means``); a strategy that cannot be created takes none."""
    out = {}
    for name in names:
        try:
            strategy = plugins.strategy(name).create()
        except Exception:  # an unavailable one: reported as such elsewhere
            out[name] = frozenset()
            continue
        dims = set(strategy.mesh_dims)
        if "dp" in dims:
            dims = (dims - {"dp"}) | {strategy.dp_means}
        out[name] = frozenset(dims)
    return out


def degree_problems(workload: Any, capabilities: frozenset[str] | set[str],
                    degree: int = 4) -> dict[str, str | None]:
    """Why ``tp=<degree>`` and ``pp=<degree>`` cannot train this workload (None where they
    can), asked of its hints on a model built on the meta device (no memory, no data)."""
    import torch

    def ask(hint: str, call) -> str | None:
        if hint not in capabilities:
            return f"the workload declares no {hint}"
        try:
            with torch.device("meta"):
                call(workload.build_model())
        except Exception as exc:  # the workload's own UsageError names the limit
            return f"{type(exc).__name__}: {exc}" if not _usage(exc) else str(exc)
        return None

    return {f"tp={degree}": ask("tp_plan", lambda m: workload.prepare_tensor_parallel(m, degree)),
            f"pp={degree}": ask("pipeline_splits",
                                lambda m: _stages(workload.pipeline_stages(m, degree), degree))}


def _stages(stages: Any, degree: int) -> None:
    if len(list(stages)) != degree:
        raise ValueError(f"pipeline_stages(model, {degree}) gave another number of stages")


def _usage(exc: Exception) -> bool:
    from ddl.contract.errors import UsageError

    return isinstance(exc, UsageError)
