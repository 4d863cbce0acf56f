"""The commands: ``cli`` parses ``ddl ...`` and dispatches; ``scaling`` and ``report`` (scaling
studies), ``doctor`` (node checks), ``plugin_listing``. The top layer: it may import
everything below, nothing imports it."""
