"""Fill a new venv with the packages of a cached one, as hard links (scripts/bootstrap.sh).

    python scripts/venv_link.py CACHED_VENV NEW_VENV

The cached venv holds requirements.lock installed once per machine (6 GB with torch's CUDA
libraries); pip takes ~80 s to lay that down, hard links take ~1 s. Both venvs are made by
the same interpreter, so their layouts match. Everything under lib/, include/ and share/ is
linked; the console scripts in bin/ are written anew with the new venv's interpreter in
their first line (a linked script would run the cached venv's Python, which lacks ddl).
pip replaces files rather than writing into them, so an upgrade in either venv leaves the
other's files as they were.

Exit 0 when linked; 1 with one line when linking is impossible here (the two on different
file systems, say): the caller then installs the ordinary way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

LINKED = ("lib", "include", "share")
OWN_FILES = ("python", "activate", "Activate.ps1", "pydoc")  # each venv makes its own


def shebang(python: Path) -> str:
    """The first line(s) pip would write: a plain `#!` unless the kernel cannot take the
    path (over 127 bytes or with a space), then a `/bin/sh` line that execs Python."""
    if len(str(python)) < 120 and " " not in str(python):
        return f"#!{python}\n"
    return f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"


def shebang_lines(text: bytes, cached_python_dir: Path) -> int:
    """How many leading lines name the cached venv's Python (0: not a script of it)."""
    prefix = str(cached_python_dir).encode()
    lines = text.split(b"\n", 3)
    if lines[0].startswith(b"#!" + prefix):
        return 1
    if lines[0] == b"#!/bin/sh" and len(lines) > 2 and prefix in lines[1]:
        return 3
    return 0


def link_scripts(cached: Path, venv: Path) -> None:
    for script in sorted((cached / "bin").iterdir()):
        if script.name.startswith(OWN_FILES) or (venv / "bin" / script.name).exists():
            continue
        target = venv / "bin" / script.name
        data = script.read_bytes()
        skip = shebang_lines(data, cached / "bin")
        if not skip:  # a binary (shellcheck) or a shell script that names no Python
            os.link(script, target)
            continue
        body = data.split(b"\n", skip)[skip]
        target.write_bytes(shebang(venv / "bin" / "python").encode() + body)
        shutil.copymode(script, target)


def main(argv: list[str]) -> int:
    cached, venv = (Path(a).absolute() for a in argv)
    for part in LINKED:
        if (cached / part).is_dir():
            (venv / part).mkdir(exist_ok=True)
            proc = subprocess.run(["cp", "-al", "--", f"{cached / part}/.", f"{venv / part}/"],
                                  capture_output=True, text=True)
            if proc.returncode:
                first = (proc.stderr.strip().splitlines() or ["cp failed"])[0]
                print(f"ddl: cannot link {cached} into {venv}: {first}", file=sys.stderr)
                return 1
    link_scripts(cached, venv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
