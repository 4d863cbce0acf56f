"""Slurm's time values, checked before a script is written: ``--time`` in one of sbatch's
forms and within the partition's limit, and the stop margin inside it; and how an error line
quotes a user's value (cut, so a pasted 100,000 characters stay one short line).
"""

from __future__ import annotations

import re

from ddl.contract.errors import UsageError
from ddl.settings.sites import SiteProfile

# Slurm's time forms (sbatch --time; parse_time.c time_str2secs): MM, MM:SS, HH:MM:SS,
# D-HH, D-HH:MM, D-HH:MM:SS. The first field is open (90:00 is 90 minutes, 36:00:00 is 36
# hours, as Slurm reads them); the fields after it are clock fields: Slurm would just add
# them up (99:99:99 = 100 h 40 min 39 s), so one out of range (seconds or minutes over 59,
# hours after a day over 23) is a typo, refused (issue 52).
SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                        r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
UNLIMITED = ("INFINITE", "UNLIMITED")
TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"


def shown(value: str, keep: int = 40) -> str:
    """A user's value as an error line quotes it: repr, cut to ``keep`` characters (a
    100,000-character paste must not become a 100,000-character "one line")."""
    if len(value) <= keep:
        return repr(value)
    return f"{value[:keep]!r}... ({len(value)} characters)"


def slurm_seconds(value: str) -> int | None:
    """A Slurm time in seconds; None for no limit (INFINITE, UNLIMITED, or 0 as sbatch
    reads ``--time=0``). ValueError if it is not a Slurm time."""
    if value.upper() in UNLIMITED:
        return None
    match = SLURM_TIME.match(value)
    if not match:
        raise ValueError(f"{shown(value)} is not a Slurm time; allowed: {TIME_FORMS}")
    n = {k: int(v) if v else 0 for k, v in match.groupdict().items()}
    clock = [("hours", n["dh"], 23), ("minutes", n["dm"], 59), ("seconds", n["ds"], 59)]
    if match["days"] is None:  # HH:MM:SS has clock minutes and seconds; MM:SS seconds
        clock = ([("minutes", n["b"], 59), ("seconds", n["c"], 59)]
                 if match["c"] is not None else [("seconds", n["b"], 59)])
    for name, number, top in clock:
        if number > top:
            raise ValueError(f"{shown(value)} has {number} {name}; allowed: {TIME_FORMS}, "
                             f"with {name} 0-{top} after the first field")
    if match["days"] is not None:
        seconds = ((n["days"] * 24 + n["dh"]) * 60 + n["dm"]) * 60 + n["ds"]
    elif match["c"] is not None:  # HH:MM:SS
        seconds = (n["a"] * 60 + n["b"]) * 60 + n["c"]
    else:  # MM or MM:SS
        seconds = n["a"] * 60 + n["b"]
    return seconds or None


def check_time(value: str, part_name: str, max_time: str | None, site: SiteProfile) -> str:
    """``--time`` checked against the partition's limit (sbatch would refuse it, or the job
    would wait in the queue for ever)."""
    try:
        wanted = slurm_seconds(value)
    except ValueError as exc:
        raise UsageError(f"--time: {exc}") from None
    if not max_time:
        return value
    try:
        limit = slurm_seconds(max_time)
    except ValueError as exc:
        raise UsageError(f"{site.source or site.name}: partitions.{part_name}.max_time: "
                         f"{exc}") from None
    if limit is not None and (wanted is None or wanted > limit):
        raise UsageError(f"--time: partition {part_name} of {site.name} allows at most "
                         f"{max_time} (got {value})")
    return value


def check_stop_margin(margin_s: int, time: str) -> None:
    """The margin must fall inside the time limit: one as long would stop the job (and
    requeue it) at every start; a negative one is no time before the end."""
    if margin_s < 0:
        raise UsageError(f"--stop-margin: {margin_s}; allowed: seconds >= 0 (0 = off)")
    limit = slurm_seconds(time)
    if margin_s and limit is not None and margin_s >= limit:
        raise UsageError(f"--stop-margin: {margin_s} s is not shorter than --time {time} "
                         f"({limit} s): the job would stop at once and requeue for ever; "
                         f"allowed: 0 (off) to {limit - 1}")
