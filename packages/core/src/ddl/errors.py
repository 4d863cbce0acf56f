"""Errors the CLI turns into one clear line instead of a traceback.

`UsageError` means the user asked for something that is not allowed (exit code 2);
`DdlError` is a failure of the environment (no network, a crashed worker; exit code 1).
Messages name what was wrong and what is allowed, on a single line.
"""


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
