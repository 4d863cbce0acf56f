"""Where this process's Unix sockets go: short paths, whatever TMPDIR is.

multiprocessing puts its sockets in a folder it makes under TMPDIR: the local launcher's
fork server listens on one, and DataLoader workers hand each batch over through one. A
socket's path has at most 107 bytes, so a long TMPDIR (a job's scratch folder on a
cluster) stops a run with "OSError: AF_UNIX path too long" (measured: any TMPDIR over 75
characters). Then that folder is made in /tmp instead; everything else keeps the user's
TMPDIR. The launcher and every rank call :func:`keep_short` before they start processes;
a loader worker forked from a rank inherits its folder. (CPython 3.14 falls back to /tmp
by itself.)
"""

from __future__ import annotations

import os
import tempfile

#: TMPDIR lengths up to this leave room for multiprocessing's socket path (two folders of
#: ~15 characters below it, 107 bytes in all).
LONGEST_TMPDIR = 64
SHORT_BASE = "/tmp"


def keep_short() -> None:
    """Make multiprocessing's folder of this process under /tmp if TMPDIR is too long for
    a socket path (and /tmp is writable); otherwise leave everything as it is."""
    import multiprocessing.util

    if len(tempfile.gettempdir()) <= LONGEST_TMPDIR or not os.access(SHORT_BASE, os.W_OK):
        return
    kept = tempfile.tempdir
    tempfile.tempdir = SHORT_BASE
    try:
        multiprocessing.util.get_temp_dir()  # made once per process, then kept
    finally:
        tempfile.tempdir = kept
