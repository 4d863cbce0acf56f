"""``ddl check-plugin NAME``: the conformance kit (ddl.conformance) as a command. One line
per check (PASS, FAIL, UNAVAILABLE or NOT RUN, with the detail), then a summary; exit 0 when
no check failed (an unavailable strategy, a dependency not installed, is no failure, nor a
check the workload cannot take, such as pp=4 on a 2-block model), 1 otherwise.

The in-process checks run in order and stop at the first failure (the next ones need what
it checks); then ``meta-build`` (ddl.conformance.meta_build: the model built on the meta
device equals a plain build, or ddl falls back with a note), then one process and each
strategy through `ddl train`, each its own line. When the meta build differs, the FAIL
line of every run that builds on the meta device names the build as the cause.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddl.contract.errors import UsageError


def cmd_check_plugin(ns: argparse.Namespace) -> int:
    from ddl import conformance
    from ddl.contract.plugins import Plugins

    if ns.tolerance != "auto" and ns.tolerance not in conformance.TOLERANCES:
        # before anything runs: the in-process checks alone take minutes on a large model
        raise UsageError(f"--tolerance: unknown rule {ns.tolerance[:40]!r}; allowed: auto, "
                         f"{', '.join(conformance.TOLERANCES)}")
    plugins = Plugins()
    spec = plugins.workload(ns.name)  # unknown name: UsageError
    strategies = plugins.strategies()
    chosen = conformance.supported_strategies(spec, plugins) + [
        s for s, st in strategies.items() if st.supports(spec) and st.unavailable()]
    unknown = [c for c in ns.checks or () if c not in conformance.CHECKS]
    if unknown:
        raise UsageError(f"--checks: unknown {', '.join(unknown)}; allowed: "
                         f"{', '.join(conformance.CHECKS)}")
    if ns.strategies is not None:
        unknown = [s for s in ns.strategies if s not in strategies]
        if unknown:
            raise UsageError(f"--strategies: unknown {', '.join(unknown)}; installed: "
                             f"{', '.join(strategies)}")
        chosen = list(dict.fromkeys(ns.strategies))
    if ns.preset not in spec.presets:  # before the work directory is made
        raise UsageError(f"--preset {ns.preset!r}: workload {spec.name} has "
                         f"{', '.join(spec.presets)}")
    work_dir = (ns.work_dir or Path(f"check-plugin-{spec.name}")).resolve()
    data_dir = (ns.data_dir or work_dir / "data").resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"checking workload {spec.name!r} (preset {ns.preset}) in {work_dir}", flush=True)
    counts = {"PASS": 0, "FAIL": 0, "UNAVAILABLE": 0, "NOT RUN": 0}

    def line(status: str, check: str, detail: str = "") -> None:
        counts[status] += 1
        print(f"{status:<11} {check}" + (f": {detail}" if detail else ""), flush=True)

    workload = _in_process(conformance, spec, data_dir, ns.preset, line)
    build_differs = None
    if workload is not None:
        report = conformance.check_meta_build(workload.build_model)
        line("PASS" if report.ok else "FAIL", "meta-build", report.summary())
        build_differs = None if report.ok else report
    if workload is not None:
        runnable = [s for s in chosen if not strategies[s].unavailable()]
        for s in chosen:
            if s not in runnable:
                line("UNAVAILABLE", f"strategy:{s}", strategies[s].unavailable() or "")
        if runnable:
            rule = conformance.tolerance_for(ns.tolerance, workload.optimizer(
                list(workload.build_model().parameters()), spec.presets[ns.preset].lr))
            plan = conformance.plan_for(spec.capabilities, workload, runnable, ns.checks,
                                        plugins)
            for skipped in plan.skipped:
                line("NOT RUN", skipped.label, skipped.reason)
            from ddl.conformance.runs import micro_batching_is_equivalent

            noise = micro_batching_is_equivalent(workload.build_model())
            for run, failure in conformance.equivalence_results(
                    spec.name, data_dir, work_dir, plan.runs, rule, ns.preset, noise=noise):
                label = "strategy:one process" if run is None else f"strategy:{run.label}"
                detail = failure.detail if failure else ""
                if failure and build_differs is not None and run is not None \
                        and _splits_model(run.args):
                    detail = ("the cause is the meta-device build, not a hook (see meta-build "
                              f"above: {build_differs.summary()}); the run: {detail}")
                line("FAIL" if failure else "PASS", label, detail)
    print(f"{spec.name}: {counts['PASS']} passed, {counts['FAIL']} failed, "
          f"{counts['UNAVAILABLE']} unavailable"
          + (f", {counts['NOT RUN']} not run" if counts["NOT RUN"] else "")
          + ("" if workload is not None else " (later checks not run)"))
    return 1 if counts["FAIL"] else 0


def _splits_model(args: tuple[str, ...]) -> bool:
    """Whether a kit run's layout splits the model, so builds it on the meta device
    (ddl_strategies.compose: everything but one process and whole DDP replicas)."""
    options = dict(zip(args[::2], args[1::2]))
    strategy = options.get("--strategy", "")
    if strategy and strategy not in ("ddp", "accelerate"):
        return True
    mesh = options.get("--mesh", "")
    return any(part.split("=")[0] in ("dp_shard", "tp", "pp") and part.split("=")[-1] != "1"
               for part in mesh.split(",") if part)


def _in_process(conformance, spec, data_dir: Path, preset: str, line):
    """The in-process checks, a line each; the workload object, or None after a failure."""
    if preset not in spec.presets:
        raise UsageError(f"--preset {preset!r}: workload {spec.name} has "
                         f"{', '.join(spec.presets)}")
    try:
        conformance.check_spec(spec)
        line("PASS", "presets, capabilities")
        workload = conformance.check_data(spec, data_dir, preset)
        line("PASS", "data", str(data_dir))
        splits = conformance.check_datasets(workload, data_dir, spec.name)
        line("PASS", "datasets", ", ".join(f"{s} {len(d)}" for s, d in splits.items()))
        conformance.check_model(workload, splits["train"], spec.name)
        line("PASS", "forward-backward, metrics")
        conformance.check_hints(spec, workload)
        hints = sorted(spec.capabilities)
        line("PASS", "hints", ", ".join(hints) if hints else "none declared")
    except conformance.ContractBroken as exc:
        line("FAIL", exc.contract, exc.detail)
        return None
    return workload
