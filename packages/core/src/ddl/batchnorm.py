"""Deprecated: ghost BatchNorm moved to :mod:`ddl.contract.batchnorm` in contract 2.0.

The names of the 1.x path keep working, each with a ContractDeprecationWarning naming the
new import, until contract 2.1 (CHANGELOG.md; docs/plugin-authors.md, "Migrating plugins").
Cross-replica BatchNorm is no longer a workload's choice: ``--sync-bn`` applies it to any
model (ddl.worker.build.sync_bn), and ``convert`` knows the kinds "plain" and "ghost" only.
"""

from ddl.contract.deprecation import moved_module

__getattr__, __dir__ = moved_module(
    __name__, "ddl.contract.batchnorm", ["KINDS", "GhostBatchNorm2d", "convert"],
    gone={"CrossReplicaBatchNorm2d": "train with --sync-bn, which converts every plain "
                                     "BatchNorm of any workload's model"})
