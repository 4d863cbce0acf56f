"""Finding plugins: the entry-point group ``ddl`` of installed distributions, plus explicit
registration (tests, notebooks).

pluggy's own ``load_setuptools_entrypoints`` stops at the first plugin that fails to import.
ddl loads each entry point itself so that one broken third-party plugin is reported by name
with its error while every other plugin keeps working.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

import pluggy

from ddl.contract import hookspecs
from ddl.contract.deprecation import ContractDeprecationWarning
from ddl.contract.errors import DdlError, UsageError
from ddl.contract.specs import StrategySpec, WorkloadSpec

ENTRY_POINT_GROUP = "ddl"


@dataclass(frozen=True)
class PluginInfo:
    """Where a plugin came from; shown by ``ddl plugins``."""

    name: str
    source: str  # "entry point ddl_mnist.plugin (ddl-mnist 0.1.0)" or "registered"
    error: str | None = None  # set when the plugin could not be loaded
    version: str | None = None  # "ddl-mnist 0.1.0" for installed distributions
    # what loading it warned about: deprecated names it imports (ddl.contract.deprecation)
    deprecated: tuple[str, ...] = ()


class Plugins:
    """The loaded plugins and what they registered."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        if load_entry_points:
            self._load_entry_points()

    def _load_entry_points(self) -> None:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            version = f"{ep.dist.name} {ep.dist.version}" if ep.dist else None
            source = f"entry point {ep.value}" + (f" ({version})" if version else "")
            try:
                with _deprecations() as used:
                    module = ep.load()
                self._pm.register(module, name=ep.name)
            except Exception as exc:  # a third party's import error must not stop ddl
                self.infos.append(PluginInfo(ep.name, source, f"{type(exc).__name__}: {exc}",
                                             version))
            else:
                self.infos.append(PluginInfo(ep.name, source, version=version,
                                             deprecated=tuple(used)))

    def register(self, plugin: Any, name: str) -> None:
        """Register a module or object with hook implementations directly."""
        self._pm.register(plugin, name=name)
        self.infos.append(PluginInfo(name, "registered"))

    def version_of(self, plugin_name: str) -> str | None:
        return next((i.version for i in self.infos if i.name == plugin_name), None)

    @property
    def broken(self) -> list[PluginInfo]:
        return [info for info in self.infos if info.error]

    def _collect(self, hook_name: str, kind: type) -> list[Any]:
        """Call a registration hook plugin by plugin, tagging each spec with its plugin. A
        plugin whose hook fails or returns something else than a list of ``kind`` is set
        aside as broken, by name, and the others stay usable."""
        specs: list[Any] = []
        hook = getattr(self._pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            try:
                returned = impl.function() or []
                wrong = _not_a_list_of(returned, kind)
                if wrong:
                    raise TypeError(f"{hook_name} returned {wrong}; it must return a list of "
                                    f"{kind.__name__}")
            except Exception as exc:
                self._set_aside(impl.plugin_name, hook_name, f"{type(exc).__name__}: {exc}")
                continue
            specs.extend(replace(spec, plugin=impl.plugin_name) for spec in returned)
        return specs

    def _set_aside(self, name: str, hook_name: str, error: str) -> None:
        """List a plugin whose hook failed as broken, once, naming where it came from."""
        if any(i.name == name and i.error == error for i in self.infos):
            return
        loaded = next((i for i in self.infos if i.name == name), None)
        source = f"{loaded.source}, hook {hook_name}" if loaded else f"hook {hook_name}"
        self.infos.append(PluginInfo(name, source, error, loaded.version if loaded else None))

    def workloads(self) -> dict[str, WorkloadSpec]:
        return _by_name(self._collect("ddl_register_workloads", WorkloadSpec), "workload")

    def strategies(self) -> dict[str, StrategySpec]:
        return _by_name(self._collect("ddl_register_strategies", StrategySpec), "strategy")

    def site_dirs(self) -> list[Any]:
        return [d for dirs in self._pm.hook.ddl_site_dirs() for d in dirs]

    def workload(self, name: str) -> WorkloadSpec:
        return _pick(self.workloads(), name, "plugin", self.broken)

    def strategy(self, name: str) -> StrategySpec:
        return _pick(self.strategies(), name, "strategy", self.broken)


@contextmanager
def _deprecations() -> Iterator[list[str]]:
    """Collect the contract deprecation warnings raised inside (a plugin's imports of moved
    names) instead of showing them: Python hides DeprecationWarnings outside ``__main__``, so
    ``ddl plugins`` tells them. Any other warning goes on as it would have."""
    used: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ContractDeprecationWarning)
        yield used
    for w in caught:
        if issubclass(w.category, ContractDeprecationWarning):
            used.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _not_a_list_of(returned: Any, kind: type) -> str | None:
    """What is wrong with a registration hook's answer, or None."""
    if not isinstance(returned, (list, tuple)):
        return f"a {type(returned).__name__}, not a list"
    for item in returned:
        if not isinstance(item, kind):
            return f"a list holding a {type(item).__name__}"
    return None


def _by_name(specs: list[Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for spec in specs:
        if spec.name in found:
            raise DdlError(f"two plugins register the {kind} {spec.name!r}: "
                           f"{found[spec.name].plugin} and {spec.plugin}")
        found[spec.name] = spec
    return found


def _pick(known: dict[str, Any], name: str, flag: str, broken: list[PluginInfo]) -> Any:
    if name in known:
        return known[name]
    allowed = ", ".join(sorted(known)) or "none installed"
    hint = ""
    if any(info.name == name for info in broken):
        hint = f" (plugin {name!r} is installed but failed to load; see `ddl plugins`)"
    shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}...({len(name)} characters)"
    raise UsageError(f"--{flag}: unknown {flag} {shown}; allowed: {allowed}{hint}")
