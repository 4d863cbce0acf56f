"""Deprecated: the data-set install helpers moved to :mod:`ddl.contract.datafiles` in contract 2.0.

The names of the 1.x path keep working, each with a ContractDeprecationWarning naming the
new import, until contract 2.1 (CHANGELOG.md; docs/plugin-authors.md, "Migrating plugins").
"""

from ddl.contract.deprecation import moved_module

__getattr__, __dir__ = moved_module(
    __name__, "ddl.contract.datafiles",
    ["MARKER", "FILESYSTEM_ERRNOS", "prepare_hint", "without_hint", "first_line",
     "short_reason", "is_filesystem_error", "unreachable", "download_failure",
     "quiet_download", "make_data_dir", "holds_files", "is_synthetic", "protect_real_data",
     "md5_of", "md5_manifest", "parse_md5_manifest", "scratch_dir", "replacing",
     "new_synthetic_set", "install", "fsync_tree"])
