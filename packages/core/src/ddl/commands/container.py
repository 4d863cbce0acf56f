"""``ddl container build|check``: the command around ddl.launch.container_build."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddl.contract.errors import DdlError


def cmd_container(ns: argparse.Namespace) -> int:
    import shlex

    from ddl.launch import container_build as container

    definition = ns.definition or container.definition_for(ns.target)
    request = container.BuildRequest(
        definition=definition, wheelhouse=ns.wheelhouse, base=ns.base, offline=ns.offline,
        build_args=dict(ns.build_args),
        output=getattr(ns, "output", None) or container.default_output())
    if ns.action == "check":
        container.validate(request)
        print(f"ddl: {definition} is fine")
        return 0
    request.force, request.no_compress, request.fakeroot = ns.force, ns.no_compress, ns.fakeroot
    request.no_test = ns.no_test
    try:
        runtime = container.detect_runtime(container.find_runtime(ns.runtime))
    except DdlError:
        if not ns.dry_run:
            raise
        runtime = ns.runtime or "apptainer"  # printing the command needs no runtime
    command = container.prepare(request, runtime, check=not ns.no_check)
    if ns.dry_run:
        print(shlex.join(command))
        return 0
    from ddl.launch.container_offline import require_registries

    require_registries(definition, container.build_arguments(request))
    container.run_build(command, definition)
    name = Path(command[0]).name
    print(f"ddl: built {request.output}; try `{name} run {request.output} --help` and "
          f"`{name} test {request.output}`")
    return 0
