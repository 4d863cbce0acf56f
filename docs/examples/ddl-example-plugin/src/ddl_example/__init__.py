"""An example external ddl workload plugin (see docs/plugin-authors.md)."""
