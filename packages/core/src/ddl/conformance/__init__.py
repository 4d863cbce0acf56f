"""The conformance kit: checks that a workload plugin keeps ddl's workload contract.

Third-party plugin authors call it from their own test suite (pytest or not)::

    from ddl import conformance

    def test_my_workload_conforms(tmp_path):
        conformance.check_workload("mywork", tmp_path)

Each check raises :class:`ContractBroken` (an ``AssertionError``, so pytest reports it as a
failure) whose message names the broken contract, the workload, and what was found. The
``strategy:<label>`` checks go through the real ``ddl train`` command line
(ddl.conformance.runs), so the workload must be installed (an entry point in group
``ddl``); the in-process checks (ddl.conformance.inprocess) also accept a spec that was
never installed. "The same weights" is a named rule (ddl.conformance.tolerance).

Contracts (the names the messages use):
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddl.conformance.checks import (
    CHECKS,
    CheckSchedule,
    NotChecked,
    Plan,
    Skipped,
    degree_problems,
    plan_checks,
    plan_runs,
    strategy_mesh_dims,
)
from ddl.conformance.contracts import CONTRACTS, ContractBroken
from ddl.conformance.inprocess import (
    check_data,
    check_datasets,
    check_hints,
    check_in_process,
    check_model,
    check_spec,
    stage_name_problem,
)
from ddl.conformance.meta_build import MetaBuildReport, assert_meta_build, check_meta_build
from ddl.conformance.runs import (
    DDL_COMMAND,
    STEPS,
    Run,
    check_equivalence,
    equivalence_results,
)
from ddl.conformance.tolerance import (
    TOLERANCES,
    Tolerance,
    assert_same_weights,
    tolerance_for,
)

__doc__ += "".join(f"\n- ``{name}``: {text}." for name, text in CONTRACTS.items())
__all__ = [
    "CHECKS",
    "CONTRACTS",
    "DDL_COMMAND",
    "STEPS",
    "TOLERANCES",
    "CheckSchedule",
    "ContractBroken",
    "MetaBuildReport",
    "NotChecked",
    "Plan",
    "Run",
    "Skipped",
    "Tolerance",
    "assert_meta_build",
    "assert_same_weights",
    "check_data",
    "check_datasets",
    "check_equivalence",
    "check_hints",
    "check_in_process",
    "check_meta_build",
    "check_model",
    "check_spec",
    "check_strategies",
    "check_workload",
    "degree_problems",
    "equivalence_results",
    "plan_checks",
    "plan_for",
    "plan_runs",
    "stage_name_problem",
    "strategy_mesh_dims",
    "supported_strategies",
    "tolerance_for",
]


def supported_strategies(spec: Any, plugins: Any = None) -> list[str]:
    """The installed strategies whose requirements the workload's capabilities meet and
    whose dependencies are installed (StrategySpec.unavailable)."""
    from ddl.contract.plugins import Plugins

    strategies = (plugins or Plugins()).strategies()
    return [s for s, strategy in strategies.items()
            if strategy.supports(spec) and not strategy.unavailable()]


def plan_for(capabilities: frozenset[str], workload: Any, strategies: list[str],
             checks: Any = None, plugins: Any = None) -> CheckSchedule:
    """plan_checks with what the installed plugins say: the strategies' ``--mesh``
    dimensions and (``workload`` given) the tp and pp degrees its model allows."""
    from ddl.contract.plugins import Plugins

    plugins = plugins or Plugins()
    probe = workload is not None and (checks is None or "degrees" in checks)
    return plan_checks(strategies, capabilities, checks=checks,
                       mesh_dims=strategy_mesh_dims(plugins, strategies),
                       degrees=degree_problems(workload, capabilities) if probe else None)


def _report(skipped: list[Skipped]) -> list[Skipped]:
    import warnings

    for item in skipped:
        warnings.warn(f"ddl.conformance: {item.label} not run: {item.reason}", NotChecked,
                      stacklevel=3)
    return skipped


def check_strategies(name: str, data_dir: Path, work_dir: Path, strategies: list[str],
                     preset: str = "tiny", *, tolerance: str | Tolerance = "per-tensor",
                     capabilities: frozenset[str] | None = None, checks: Any = None,
                     parallel: int = 2, command: tuple[str, ...] = DDL_COMMAND
                     ) -> list[Skipped]:
    """``strategy:<label>`` for the named strategies alone (the workload installed, its
    data in ``data_dir``): one process, then each of ``checks`` (default: all of
    :data:`CHECKS`), weights compared. ``capabilities``: the installed workload's unless
    given. Returns the checks not run, each also warned as :class:`NotChecked`."""
    from ddl.contract.plugins import Plugins

    plugins = Plugins()
    spec = plugins.workloads().get(name)
    workload = spec.create(spec.presets[preset]) if spec and preset in spec.presets else None
    if capabilities is None:
        capabilities = spec.capabilities if spec else frozenset()
    plan = plan_for(frozenset(capabilities), workload, strategies, checks, plugins)
    check_equivalence(name, data_dir, work_dir, plan.runs, tolerance_for(tolerance), preset,
                      parallel=parallel, command=command, noise=_noise_applies(workload))
    return _report(plan.skipped)


def check_workload(name: str, work_dir: Path, preset: str = "tiny", *,
                   strategies: list[str] | None = None, tolerance: str | Tolerance = "auto",
                   checks: Any = None, parallel: int = 2, plugins: Any = None,
                   command: tuple[str, ...] = DDL_COMMAND) -> list[Skipped]:
    """The whole kit for an installed workload: the in-process checks, then one process
    and ``checks`` (default: all of :data:`CHECKS`: every strategy in ``strategies``,
    default each ``ddl plugins`` marks supported, HSDP, the 3-D mesh, tp and pp degrees
    of 4, accumulation, clipping, resume) through ``ddl train``, final weights compared by
    ``tolerance``: a rule name of :data:`TOLERANCES`, a :class:`Tolerance`, or ``auto``
    (``elementwise`` for an SGD-like optimizer, ``per-tensor`` for Adam and the like).
    ``work_dir`` receives the synthetic data and the run directories; ``parallel``
    launches run at a time. Returns the checks not run (each warned as
    :class:`NotChecked`, with the reason)."""
    from ddl.contract.plugins import Plugins

    plugins = plugins or Plugins()
    spec = plugins.workload(name)
    work_dir = Path(work_dir)
    data_dir = work_dir / "data"
    check_in_process(spec, data_dir, preset)
    workload = spec.create(spec.presets[preset])
    rule = tolerance_for(tolerance, workload.optimizer(
        list(workload.build_model().parameters()), spec.presets[preset].lr))
    chosen = supported_strategies(spec, plugins) if strategies is None else strategies
    plan = plan_for(spec.capabilities, workload, chosen, checks, plugins)
    check_equivalence(name, data_dir, work_dir, plan.runs, rule, preset, parallel=parallel,
                      command=command, noise=_noise_applies(workload))
    return _report(plan.skipped)


def _noise_applies(workload: Any) -> bool:
    """Whether the kit trains a noise reference for this workload (micro-batches are the
    same computation for its model; ddl.conformance.tolerance)."""
    from ddl.conformance.runs import micro_batching_is_equivalent

    return workload is None or micro_batching_is_equivalent(workload.build_model())


def check_ddp_equivalence(name: str, data_dir: Path, work_dir: Path, preset: str = "tiny", *,
                          global_batch: int = 16, rtol: float = 1e-5,
                          command: tuple[str, ...] = DDL_COMMAND) -> None:
    """Deprecated (contract 1.x; goes in 2.1): ``check_strategies(name, data_dir, work_dir,
    ["ddp"], preset)`` does what it did, one process against ``ddp`` on 2. Kept with its old
    comparison (every element within ``rtol``, absolute ``rtol / 10``); a failure now names
    the contract ``strategy:ddp``, no longer ``ddp-equivalence``."""
    from ddl.contract.deprecation import warn

    warn("ddl.conformance.check_ddp_equivalence", "use `conformance.check_strategies(name, "
         "data_dir, work_dir, ['ddp'], preset)`")
    rule = Tolerance("elementwise", per_tensor=False, rtol=rtol, atol=rtol * 0.1)
    check_equivalence(name, data_dir, work_dir, plan_runs(["ddp"], frozenset(),
                                                          checks=["strategies"]), rule, preset,
                      global_batch=global_batch, command=command)
