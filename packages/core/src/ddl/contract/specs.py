"""Light descriptions of workloads and strategies, returned by the registration hooks.

Nothing here imports torch. A spec names its implementation by a ``"module:attribute"``
factory path which is imported only when a run needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddl.contract.errors import DdlError
from ddl.contract.version import parse_range

#: Workload capabilities a strategy can require (parallelism hints, see ddl.contract.workload).
CAPABILITIES = {
    "fsdp_units": "names the sub-modules FSDP shards one by one",
    "tp_plan": "gives a tensor-parallel plan (column-/row-wise layers)",
    "pipeline_splits": "names the points where the model splits into pipeline stages",
}


@dataclass(frozen=True)
class Preset:
    """A named size of a workload with its training defaults.

    ``tiny`` is small enough for CPU tests; the default preset is the size the course uses.
    ``options`` are passed to the workload's factory (model widths, sample limits, ...).
    """

    name: str
    summary: str
    epochs: int
    batch_size: int  # per replica, as the course runs it on one device
    lr: float
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The model's parameter count, where known without building it: lets checks that must
    #: not import torch (``ddl submit``'s memory check) size the model. None: unknown.
    parameters: int | None = None
    #: The model's attention heads per layer (the count tensor parallel must divide), where
    #: known without building it: ``ddl submit`` refuses a tp degree that does not divide
    #: it before the queue (ddl.contract.layout.check_heads). None: checked in the job.
    attention_heads: int | None = None


def load_factory(path: str | Callable[..., Any]) -> Callable[..., Any]:
    """Import ``"package.module:attribute"`` (or pass a callable through)."""
    if callable(path):
        return path
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attribute) if attribute else module
    except (ImportError, AttributeError) as exc:
        raise DdlError(f"cannot load {path!r}: {type(exc).__name__}: {exc}") from exc


def _check_contract(contract: str) -> None:
    """A malformed range is the plugin author's error: its registration fails, and
    `ddl plugins` lists the plugin as BROKEN with this message."""
    if contract:
        parse_range(contract)


@dataclass(frozen=True)
class WorkloadSpec:
    """What a workload plugin registers."""

    name: str
    summary: str
    factory: str | Callable[..., Any]  # called as factory(preset: Preset) -> ddl.contract.workload.Workload
    presets: Mapping[str, Preset]
    default_preset: str
    capabilities: frozenset[str] = frozenset()
    plugin: str = ""  # filled in by the plugin manager: which plugin registered it
    # the contract versions the plugin supports ("2", "2.1", "2-3"; ddl.contract.version);
    # "" claims nothing. `ddl plugins` says when this ddl's version is outside them.
    contract: str = ""

    def __post_init__(self) -> None:
        _check_contract(self.contract)

    def create(self, preset: Preset) -> Any:
        return load_factory(self.factory)(preset)


@dataclass(frozen=True)
class StrategySpec:
    """What a strategy plugin registers."""

    name: str
    summary: str
    factory: str | Callable[..., Any]  # called as factory(options) -> ddl.contract.strategy.Strategy
    requires: frozenset[str] = frozenset()  # workload capabilities it cannot work without
    # --sync-bn can run: every rank holds the same layers and all ranks form the one
    # data-parallel group (False for pipeline and tensor-parallel strategies)
    sync_bn: bool = True
    plugin: str = ""
    contract: str = ""  # as WorkloadSpec.contract
    # modules it imports beyond ddl's own dependencies, and what to install for them
    # (an optional extra): without them the strategy is listed but unavailable
    imports: tuple[str, ...] = ()
    install: str = ""
    # the --strategy-option keys it takes (its Strategy.options_help), so that `ddl submit`
    # can refuse a misspelt one without importing torch; None: not declared, checked in the job
    options: frozenset[str] | None = None

    def __post_init__(self) -> None:
        _check_contract(self.contract)

    def supports(self, workload: WorkloadSpec) -> bool:
        """The light check used for listings; the strategy's own check() decides at run time."""
        return self.requires <= workload.capabilities

    def unavailable(self) -> str | None:
        """Why it cannot run here (a module of ``imports`` missing: "strategy unavailable:
        install ..."), or None. Finds the modules without importing them (no torch)."""
        from importlib.util import find_spec

        missing = [m for m in self.imports if _find(find_spec, m) is None]
        if not missing:
            return None
        return f"strategy unavailable: install {self.install or ' '.join(missing)}"

    def create(self, options: Mapping[str, str] | None = None) -> Any:
        return load_factory(self.factory)(dict(options or {}))


def _find(find_spec: Callable[[str], Any], module: str) -> Any:
    """find_spec, with a module blocked in sys.modules (None) or a parent that cannot be
    found reading as missing."""
    try:
        return find_spec(module)
    except (ImportError, ValueError):
        return None
