"""The ``ddl`` command line: parse (ddl.commands.parser), dispatch to the command's module,
and turn every error a user can cause into one line on stderr and exit code 2
(ddl.contract.errors). Kept free of torch imports at module level: ``ddl --help``,
``ddl plugins`` and ``ddl sites`` answer in well under a second.
"""

from __future__ import annotations

import errno
import importlib
import sys

from ddl.commands.arguments import bounded
from ddl.commands.parser import make_parser
from ddl.contract.errors import DdlError, UsageError, as_one_line

# command -> "module:function" (imported only when that command runs)
COMMANDS = {"train": "train:cmd_train", "prepare": "train:cmd_prepare",
            "submit": "submit:cmd_submit", "container": "container:cmd_container",
            "scale": "scaling:cmd_scale", "report": "report:cmd_report",
            "plugins": "listings:cmd_plugins", "sites": "listings:cmd_sites",
            "doctor": "doctor:cmd_doctor", "layout": "layout:cmd_layout",
            "plan": "plan:cmd_plan",
            "watch": "watch:cmd_watch", "check-plugin": "check_plugin:cmd_check_plugin"}


def _command(name: str):
    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(f"ddl.commands.{module}"), function)


def _is_secondary_task() -> bool:
    """In a job every task checks the same flags; only the first one reports a mistake."""
    import os

    rank = os.environ.get("RANK") or (os.environ.get("SLURM_PROCID")
                                      if "SLURM_STEP_ID" in os.environ else None)
    return rank not in (None, "0")


def _check_decodable(args: list[str]) -> None:
    """Bytes that are not UTF-8 reach argv as lone surrogates (PEP 383); they could be
    neither printed nor written into a script, so they stop here."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            try:
                shown = repr(arg.encode("utf-8", "surrogateescape"))  # the bytes as typed
            except UnicodeEncodeError:  # a surrogate no byte decodes to (a caller's str)
                shown = ascii(arg)
            raise UsageError(f"argument {shown} is not valid UTF-8; ddl takes UTF-8 text "
                             "(file names included)") from None


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = sys.argv[1:] if argv is None else argv
    try:
        _check_decodable(args)
        ns = parser.parse_args(args or ["--help"])
        if ns.command is None:
            parser.print_help()
            return 0
        return _command(ns.command)(ns)
    except DdlError as exc:
        if not (isinstance(exc, UsageError) and _is_secondary_task()):
            print(f"ddl: error: {bounded(as_one_line(str(exc)))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ddl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`ddl sites | head -1`): not an error worth a traceback.
        # Point stdout at devnull so the interpreter's final flush cannot fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # A file system's refusal that no command put into words of its own (a path too
        # long, a file where a directory was asked for, a full disk): still one line naming
        # the path, exit 2, not a traceback.
        if exc.errno not in _FILE_ERRORS:
            raise
        print(f"ddl: error: {as_one_line(_file_error(exc))}", file=sys.stderr)
        return 2


_FILE_ERRORS = {errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT,
                errno.ELOOP}


def _file_error(exc: OSError) -> str:
    """``PATH: what the system said; allowed: ...`` for a refused file operation."""
    name = str(exc.filename) if exc.filename is not None else "a file"
    shown = name if len(name) <= 60 else f"{name[:40]}...{name[-12:]} ({len(name)} characters)"
    allowed = {errno.ENAMETOOLONG: "names of at most 255 bytes, paths of less than 4096",
               errno.ENOSPC: "a file system with room (free space, or choose another path)",
               errno.EDQUOT: "a file system with room (free space, or choose another path)",
               errno.ENOTDIR: "a directory where the flag asks for one",
               errno.EEXIST: "a directory where the flag asks for one",
               errno.EISDIR: "a file where the flag asks for one"}.get(
                   exc.errno, "a path this user may read and write")
    return f"{shown}: {exc.strerror or exc}; allowed: {allowed}"


if __name__ == "__main__":
    sys.exit(main())
