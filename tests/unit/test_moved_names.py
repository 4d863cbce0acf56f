"""Names that moved in contract 2.0 keep working for one minor version: every public name of
the 1.x modules (as they were before commit 6d2b74c moved them into ddl.contract) imports
from its old path with a DeprecationWarning that names the new import and points at the
importing line; the docs' migration section lists each of them; the conformance kit's
removed check_ddp_equivalence warns and runs what replaced it."""

from __future__ import annotations

import importlib
import re
import warnings

import pytest

from conftest import REPO
from ddl.contract.deprecation import ContractDeprecationWarning

pytestmark = pytest.mark.unit

# The 1.x public names, read from `git show 6d2b74c^:packages/core/src/ddl/<module>.py`.
OLD_NAMES = {
    "hookspecs": ["PROJECT", "hookspec", "hookimpl", "ddl_register_workloads",
                  "ddl_register_strategies", "ddl_site_dirs"],
    "specs": ["CAPABILITIES", "Preset", "load_factory", "WorkloadSpec", "StrategySpec"],
    "workload": ["SPLITS", "Workload"],
    "strategy": ["Strategy"],
    "errors": ["EXIT_STOPPED", "DdlError", "UsageError", "DataError", "DataMissing",
               "as_one_line"],
    "datafiles": ["MARKER", "FILESYSTEM_ERRNOS", "prepare_hint", "without_hint", "first_line",
                  "short_reason", "is_filesystem_error", "unreachable", "download_failure",
                  "quiet_download", "make_data_dir", "holds_files", "is_synthetic",
                  "protect_real_data", "md5_of", "md5_manifest", "parse_md5_manifest",
                  "scratch_dir", "replacing", "new_synthetic_set", "install", "fsync_tree"],
    "plugins": ["ENTRY_POINT_GROUP", "PluginInfo", "Plugins"],
    "batchnorm": ["KINDS", "GhostBatchNorm2d", "convert"],
}
# 1.x names removed without a drop-in replacement (094cea4: --sync-bn for any workload)
GONE = {"batchnorm": ["CrossReplicaBatchNorm2d"]}
PAIRS = [(module, name) for module, names in OLD_NAMES.items() for name in names]


@pytest.mark.parametrize("module, name", PAIRS)
def test_every_old_name_still_imports_with_a_warning_naming_the_new_import(module, name):
    old = importlib.import_module(f"ddl.{module}")
    new = importlib.import_module(f"ddl.contract.{module}")
    with pytest.warns(ContractDeprecationWarning) as caught:
        value = getattr(old, name)  # what `from ddl.<module> import <name>` does
    assert value is getattr(new, name)
    warning = caught.pop(ContractDeprecationWarning)
    assert issubclass(warning.category, DeprecationWarning)
    assert warning.filename == __file__  # the importer's line, not the shim's
    message = str(warning.message)
    assert message.startswith(f"ddl.{module}.{name} is deprecated and goes in ddl contract 2.1")
    assert re.search(rf"use `from ddl\.contract(\.{module})? import {name}`", message), message


def test_the_old_modules_offer_nothing_else():
    for module, names in OLD_NAMES.items():
        old = importlib.import_module(f"ddl.{module}")
        assert dir(old) == sorted(names)
        with pytest.raises(AttributeError, match=f"module 'ddl.{module}' has no attribute"):
            old.not_a_name  # noqa: B018


def test_a_removed_name_says_what_replaces_it():
    from ddl import batchnorm

    with pytest.raises(AttributeError, match="CrossReplicaBatchNorm2d was removed in ddl "
                                             "contract 2.0; train with --sync-bn"):
        batchnorm.CrossReplicaBatchNorm2d  # noqa: B018


def test_from_import_of_an_old_path_warns_at_the_importing_line():
    with pytest.warns(ContractDeprecationWarning, match="from ddl.contract import WorkloadSpec") \
            as caught:
        from ddl.specs import WorkloadSpec  # noqa: F401
    assert caught[0].filename == __file__


def test_the_migration_section_lists_every_moved_name():
    text = (REPO / "docs" / "plugin-authors.md").read_text()
    section = text.split("## Migrating plugins", 1)[1].split("\n## ", 1)[0]
    gone = [(m, n) for m, names in GONE.items() for n in names]
    missing = [f"ddl.{m}.{n}" for m, n in PAIRS + gone
               if f"`{n}`" not in _row(section, f"`ddl.{m}`")]
    assert not missing, missing
    assert "check_ddp_equivalence" in section


def _row(section: str, module: str) -> str:
    """The table row of the migration section that starts with ``module``."""
    return next((line for line in section.splitlines() if line.startswith(f"| {module}")), "")


def test_check_ddp_equivalence_warns_and_runs_the_ddp_strategy_check(tmp_path):
    """It warns, then goes through the real `ddl train` as check_strategies(..., ["ddp"])
    does: for a workload that is not installed the one-process reference run fails."""
    from ddl import conformance

    with warnings.catch_warnings():
        warnings.simplefilter("error", ContractDeprecationWarning)
        with pytest.raises(ContractDeprecationWarning, match="check_strategies"):
            conformance.check_ddp_equivalence("absent", tmp_path / "data", tmp_path)
    with pytest.warns(ContractDeprecationWarning) as caught, \
            pytest.raises(conformance.ContractBroken, match="strategy:one process") as broken:
        conformance.check_ddp_equivalence("absent", tmp_path / "data", tmp_path)
    assert caught[0].filename == __file__
    assert "--plugin: unknown plugin 'absent'" in str(broken.value)


def test_run_context_parallel_reads_and_constructs_as_layout_with_a_warning(tmp_path):
    """RunContext.parallel, renamed layout: a plugin's ``self.context.parallel`` and a
    ``RunContext(parallel=...)`` still work, each warning at the plugin's line."""
    import dataclasses

    from ddl.contract import ParallelLayout, RunContext
    from ddl.contract.world import World

    layout = ParallelLayout(dp_shard=2)
    world = World(rank=0, local_rank=0, size=2, device="cpu", backend="gloo")
    with pytest.warns(ContractDeprecationWarning, match="pass layout=") as made:
        old = RunContext(tmp_path, world, epochs=1, global_batch=8, batch_per_replica=4,
                         parallel=layout)
    assert made[0].filename == __file__
    new = RunContext(tmp_path, world, layout, epochs=1, global_batch=8, batch_per_replica=4)
    assert old == new and [f.name for f in dataclasses.fields(RunContext)][2] == "layout"
    with pytest.warns(ContractDeprecationWarning, match="read RunContext.layout") as read:
        assert new.parallel is layout
    assert read[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dataclasses.replace(new, steps_per_epoch=3).layout is layout


def test_the_kits_plan_is_check_schedule_and_the_old_name_still_imports():
    from ddl.conformance import CheckSchedule, Plan, plan_checks

    assert Plan is CheckSchedule
    assert isinstance(plan_checks(["ddp"], frozenset()), CheckSchedule)
