"""The plugin contract: what a workload or strategy plugin implements and may import.

The lowest layer: it imports nothing else of ddl. Plugin authors import from here
(``from ddl.contract import Workload, WorkloadSpec, hookimpl``); the names below are the
whole public interface. The modules: hook specifications (``hookspecs``), the light specs a
plugin registers (``specs``), the interfaces (``workload``, ``strategy``), who a process is
(``world``), what a workload knows of its run (``context``), the parallel layout of a run (``layout``), the plugin manager (``plugins``), errors, and the helpers plugins share
(``datafiles`` for data-set installs, ``batchnorm`` for ghost BatchNorm in pipelines,
``fast_optim`` for fused optimizers on GPUs, ``host_memory`` for the memory a machine can give,
``state_names``). ``CONTRACT_VERSION`` (``version``) is the contract's semantic version:
the policy, and what each version changed, are in docs/plugin-authors.md and CHANGELOG.md;
``deprecation`` keeps moved names working for a minor version.
"""

from ddl.contract.context import RunContext
from ddl.contract.errors import DataError, DataMissing, DdlError, UsageError
from ddl.contract.hookspecs import hook_returning, hookimpl
from ddl.contract.layout import ParallelLayout
from ddl.contract.specs import Preset, StrategySpec, WorkloadSpec
from ddl.contract.strategy import Strategy, StrategyContext
from ddl.contract.version import CONTRACT_VERSION
from ddl.contract.workload import Workload
from ddl.contract.world import World

__all__ = ["CONTRACT_VERSION", "DataError", "DataMissing", "DdlError", "ParallelLayout",
           "Preset", "RunContext", "Strategy", "StrategyContext", "StrategySpec", "UsageError",
           "Workload", "WorkloadSpec", "World", "hook_returning", "hookimpl"]
