"""Errors the CLI turns into one clear line instead of a traceback.

`UsageError` means the user asked for something that is not allowed (exit code 2);
`DdlError` is a failure of the environment (no network, a crashed worker; exit code 1).
Messages name what was wrong and what is allowed, on a single line.
"""


#: Exit code of a run that stopped cleanly on request (SIGUSR1 or a STOP file) after writing a
#: checkpoint: not finished, resumable with ``--resume auto``.
EXIT_STOPPED = 3


class DdlError(Exception):
    """A failure ddl reports as one line; exit code 1."""

    exit_code = 1


class UsageError(DdlError):
    """Bad input from the user (flag, config file, site profile, data directory); exit code 2."""

    exit_code = 2


class DataError(UsageError):
    """A data directory that is missing, incomplete or corrupt."""


class DataMissing(DataError):
    """The data set is absent (as opposed to present but corrupt)."""


def as_one_line(message: str) -> str:
    """The message with every non-printable character escaped as Python would write it.

    User values end up in messages (paths, names, TOML keys); a newline, carriage return or
    terminal escape in one of them must not split the line or rewrite the terminal, and an
    undecodable byte from argv (a lone surrogate) must not fail the printing itself.
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)
