"""Deprecated: the plugin manager moved to :mod:`ddl.contract.plugins` in contract 2.0.

The names of the 1.x path keep working, each with a ContractDeprecationWarning naming the
new import, until contract 2.1 (CHANGELOG.md; docs/plugin-authors.md, "Migrating plugins").
"""

from ddl.contract.deprecation import moved_module

__getattr__, __dir__ = moved_module(
    __name__, "ddl.contract.plugins",
    ["ENTRY_POINT_GROUP", "PluginInfo", "Plugins"])
