"""The contract's version, and the range of versions a plugin says it was written for.

``CONTRACT_VERSION`` is ``"MAJOR.MINOR"``: a minor version only adds (a name, an optional
method, a spec field with a default), a major version breaks something a plugin may rely
on. A spec's ``contract`` field declares what the plugin supports, in one of three forms:

    "2"      any 2.x
    "2.1"    2.1 or a later 2.x (it uses something 2.1 added)
    "2-3"    any 2.x or 3.x; "2.1-3" from 2.1 on

Declaring nothing (``""``) claims nothing. A mismatch is not refused: ``ddl plugins`` says
so in one line, since a plugin may well use nothing the break touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: This ddl's plugin contract (CHANGELOG.md says what each version changed).
CONTRACT_VERSION = "2.0"

_RANGE = re.compile(r"(\d+)(?:\.(\d+))?(?:-(\d+))?")
FORMS = "'2' (any 2.x), '2.1' (2.1 or later 2.x), '2-3' or '2.1-3' (through any 3.x)"


@dataclass(frozen=True)
class ContractRange:
    """The versions a plugin supports: from ``(major, minor)`` through any ``last_major``.x."""

    first: tuple[int, int]
    last_major: int

    def problem(self, version: str = CONTRACT_VERSION) -> str | None:
        """Why ``version`` is outside the range ("targets ...", "needs ..."), or None."""
        major, minor = _parse(version)
        if not self.first[0] <= major <= self.last_major:
            majors = (str(self.first[0]) if self.first[0] == self.last_major
                      else f"{self.first[0]}-{self.last_major}")
            return f"targets ddl contract {majors}; this ddl has contract {version}"
        if (major, minor) < self.first:
            return (f"needs ddl contract {self.first[0]}.{self.first[1]} or later; this ddl "
                    f"has contract {version}")
        return None


def parse_range(text: str) -> ContractRange:
    """A spec's ``contract`` string; ValueError (one line, the allowed forms) if malformed."""
    found = _RANGE.fullmatch(text.strip()) if isinstance(text, str) else None
    if not found:
        raise ValueError(f"contract {text!r} is not a version range; allowed: {FORMS}")
    major, minor, last = found.groups()
    first = (int(major), int(minor or 0))
    last_major = int(last) if last else first[0]
    if last_major < first[0]:
        raise ValueError(f"contract {text!r} ends before it starts; allowed: {FORMS}")
    return ContractRange(first, last_major)


def _parse(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)
