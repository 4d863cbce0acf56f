"""Deprecated: the hook specifications moved to :mod:`ddl.contract.hookspecs` in contract 2.0.

The names of the 1.x path keep working, each with a ContractDeprecationWarning naming the
new import, until contract 2.1 (CHANGELOG.md; docs/plugin-authors.md, "Migrating plugins").
"""

from ddl.contract.deprecation import moved_module

__getattr__, __dir__ = moved_module(
    __name__, "ddl.contract.hookspecs",
    ["PROJECT", "hookspec", "hookimpl", "ddl_register_workloads",
     "ddl_register_strategies", "ddl_site_dirs"])
