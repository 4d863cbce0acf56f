"""The whole plugin contract: the hooks a ddl plugin may implement.

A plugin is an ordinary Python package that names a module in the entry-point group ``ddl``
(``[project.entry-points.ddl]`` in its pyproject.toml). That module implements some of the
hooks below, decorated with :data:`hookimpl`. Registration hooks return *light* specs
(:mod:`ddl.contract.specs`): names, summaries, capabilities and a factory path. The heavy code (torch,
torchvision, transformers) is imported only when a run actually builds the workload or
strategy, so listing plugins or rendering a Slurm script stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from ddl.contract.specs import StrategySpec, WorkloadSpec

PROJECT = "ddl"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


def hook_returning(*specs: WorkloadSpec | StrategySpec):
    """A registration hook that returns ``specs``, for plugins whose specs are plain data:
    ``ddl_register_workloads = hook_returning(WORKLOAD)`` in the plugin module does what a
    ``@hookimpl`` function returning ``[WORKLOAD]`` does (pluggy goes by the name)."""

    @hookimpl
    def registration() -> list:
        return list(specs)

    return registration


@hookspec
def ddl_register_workloads() -> list[WorkloadSpec]:
    """Return the workloads (model + data + loss + metrics) this plugin provides."""


@hookspec
def ddl_register_strategies() -> list[StrategySpec]:
    """Return the parallelism strategies (DDP, FSDP, ...) this plugin provides."""


@hookspec
def ddl_site_dirs() -> list[Path]:
    """Return extra directories holding site profiles (``*.toml``)."""
