"""The one code path every training process runs, however it was started.

``python -m ddl.worker RUN_DIR`` reads ``RUN_DIR/config.json`` (written by ``ddl train``),
joins the process group the launcher described in the environment, and trains.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ddl import rundir
from ddl.errors import DdlError, UsageError


def run(run_dir: Path) -> None:
    from ddl.config import RunConfig
    from ddl.distributed import close_world, init_world
    from ddl.plugins import Plugins
    from ddl.sites import get_site
    from ddl.trainer import train

    config = RunConfig.model_validate_json((run_dir / rundir.CONFIG).read_text())
    plugins = Plugins()
    site = get_site(config.site, plugins)
    world = init_world(config.device, site.accelerator, site.backend)
    try:
        train(config, world, plugins, run_dir)
    finally:
        close_world()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ddl.worker RUN_DIR", file=sys.stderr)
        return 2
    import os

    rank = int(os.environ.get("RANK", 0))
    try:
        run(Path(args[0]))
    except UsageError as exc:
        if rank == 0:  # the same on every rank; say it once
            print(f"ddl: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except DdlError as exc:
        print(f"ddl: error on rank {rank}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
