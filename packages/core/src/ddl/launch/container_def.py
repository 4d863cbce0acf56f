"""Checking an Apptainer/Singularity definition file before a long build.

A typo in a section name or a missing header costs seconds to find here and minutes (or a
queue wait on a build service) to find in a build. The reading follows Apptainer's own
parser (pkg/build/types/parser/deffile.go in apptainer/apptainer): a line whose first word
starts with ``%`` opens a section; everything before the first one is the header of
``Key: value`` lines; ``{{ NAME }}`` are build arguments whose defaults sit in
``%arguments``. Messages carry the file and line number.

Checked: the header exists and names a known bootstrap agent (and ``From:`` where the agent
needs one); header keys are known; section names are known; app sections name an app;
every ``{{ NAME }}`` has a value; a ``localimage`` base and ``%files`` sources exist on
this machine; every script section parses as shell (``sh -n``, or the interpreter a
``%post -c /bin/bash`` names), so a syntax error is found in a second rather than after
the minutes a build spends before it reaches that line; the image's stage has a
``%runscript`` that runs something: without one, ``apptainer run IMAGE train`` runs nothing
and exits 0, so a run that never trained would look like a success.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ddl.contract.errors import UsageError

SECTIONS = ("arguments", "environment", "files", "help", "labels", "post", "pre",
            "runscript", "setup", "startscript", "test")
APP_SECTIONS = ("appenv", "appfiles", "apphelp", "appinstall", "applabels", "apprun",
                "appstart", "apptest")
HEADER_KEYS = ("bootstrap", "from", "includecmd", "mirrorurl", "updateurl", "osversion",
               "include", "library", "registry", "namespace", "stage", "product", "user",
               "regcode", "productpgp", "registerurl", "modules", "fingerprints", "confurl",
               "setopt")  # and otherurl<N>
# Bootstrap agents the real apptainer 1.4 accepts (each tried against it); the value maps
# to whether the agent builds from a `From:` reference.
AGENTS = {"docker": True, "docker-archive": True, "docker-daemon": True, "oci": True,
          "oci-archive": True, "library": True, "oras": True, "shub": True,
          "localimage": True, "scratch": False, "busybox": False, "debootstrap": False,
          "arch": False, "yum": False, "dnf": False, "zypper": False}
TEMPLATE = re.compile(r"{{\s*(\w+)\s*}}")
# Sections whose body Apptainer runs as a shell script (%environment is sourced).
SCRIPT_SECTIONS = ("pre", "setup", "post", "environment", "runscript", "startscript", "test",
                   "appinstall", "apprun", "appenv", "apptest", "appstart")


@dataclass
class Definition:
    path: Path
    header: dict[str, tuple[int, str]] = field(default_factory=dict)  # key -> (line, value)
    sections: list[tuple[int, str, str]] = field(default_factory=list)  # (line, name, args)
    arguments: dict[str, str] = field(default_factory=dict)  # %arguments defaults
    files: list[tuple[int, str]] = field(default_factory=list)  # (line, text) of %files
    used: dict[str, int] = field(default_factory=dict)  # {{ NAME }} -> first line
    bodies: dict[int, list[str]] = field(default_factory=dict)  # section line -> its lines

    @property
    def bootstrap(self) -> str | None:
        return self.header.get("bootstrap", (0, None))[1]


def parse(path: Path) -> list[Definition]:
    """Split the file as Apptainer does, one Definition per stage (a line starting with
    ``Bootstrap:`` opens a stage); raises UsageError on a header line without ':'."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the definition file: {exc}") from None
    stages = [Definition(path)]
    section: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        d = stages[-1]
        if re.match(r"(?i)bootstrap:", line) and (d.header or d.sections):
            d = Definition(path)
            stages.append(d)
            section = None
        for name in TEMPLATE.findall(line):
            d.used.setdefault(name, number)
        words = line.split()
        if words and words[0].startswith("%"):
            section = words[0][1:].lower()
            d.sections.append((number, section, " ".join(words[1:])))
            d.bodies[number] = []
            continue
        if section is not None:
            d.bodies[d.sections[-1][0]].append(line)
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        if section is None:
            key, colon, value = body.split("#")[0].partition(":")
            if not colon:
                raise UsageError(f"{path}:{number}: header line {body!r} is not 'Key: value'")
            d.header.setdefault(key.strip().lower(), (number, value.strip()))
        elif section == "arguments":
            name, _, value = body.partition("=")
            d.arguments[name.strip()] = value.strip()
        elif section == "files" and not d.sections[-1][2]:  # `%files from STAGE`: not here
            d.files.append((number, body))
    return stages


def _first_word(line: str) -> str:
    if line.startswith('"'):
        return line[1:].split('"', 1)[0]
    return line.split()[0]


def check(path: Path, build_args: dict[str, str] | None = None) -> list[Definition]:
    """Raise UsageError naming the first problem (file:line, what is wrong, what is allowed)."""
    stages = parse(path)
    # Apptainer reads %arguments from every stage; --build-arg wins over them.
    values = {k: v for d in stages for k, v in d.arguments.items()}
    values.update(build_args or {})
    for d in stages:
        _check_stage(d, values)
    _check_runscript(stages[-1])  # the last stage is the image
    return stages


def _check_runscript(d: Definition) -> None:
    runscripts = [number for number, name, _ in d.sections if name == "runscript"]
    commands = [line for number in runscripts for line in d.bodies[number]
                if line.strip() and not line.strip().startswith("#")]
    if not commands:
        where = f"{d.path}:{runscripts[-1]}" if runscripts else str(d.path)
        raise UsageError(f"{where}: {'empty' if runscripts else 'no'} %runscript: "
                         "`apptainer run IMAGE train` would run nothing and exit 0; add "
                         "'%runscript' with the line '    exec ddl \"$@\"'")


def _check_stage(d: Definition, values: dict[str, str]) -> None:
    path = d.path
    for name, number in d.used.items():
        if name not in values:
            raise UsageError(f"{path}:{number}: build argument {{{{ {name} }}}} has no value; "
                             f"give it a default in %arguments or pass --build-arg {name}=...")
    for number, name, args in d.sections:
        if name in APP_SECTIONS:
            if not args:
                raise UsageError(f"{path}:{number}: %{name} needs an app name (%{name} NAME)")
        elif name not in SECTIONS:
            raise UsageError(f"{path}:{number}: unknown section %{name}; allowed: "
                             + ", ".join(f"%{s}" for s in SECTIONS + APP_SECTIONS))
    if not d.header:
        first = d.sections[0][0] if d.sections else 1
        raise UsageError(f"{path}:{first}: no header before the first section; a definition "
                         "starts with 'Bootstrap: AGENT' (and 'From: BASE')")
    for key, (number, _) in d.header.items():
        if key not in HEADER_KEYS and not re.fullmatch(r"otherurl\d+", key):
            raise UsageError(f"{path}:{number}: unknown header key {key!r}; allowed: "
                             + ", ".join(HEADER_KEYS + ("otherurl<N>",)))
    if "bootstrap" not in d.header:
        raise UsageError(f"{path}:{min(n for n, _ in d.header.values())}: the header has no "
                         "'Bootstrap:' line; allowed agents: " + ", ".join(AGENTS))
    number, agent = d.header["bootstrap"]
    agent = _substitute(agent, values).lower()
    if agent not in AGENTS:
        raise UsageError(f"{path}:{number}: unknown bootstrap agent {agent!r}; allowed: "
                         + ", ".join(AGENTS))
    if AGENTS[agent] and not d.header.get("from", (0, ""))[1]:
        raise UsageError(f"{path}:{number}: 'Bootstrap: {agent}' needs a 'From:' line")
    if agent == "localimage":
        from_line, base = d.header["from"]
        base = _substitute(base, values)
        if not Path(base).exists():
            raise UsageError(f"{path}:{from_line}: localimage base {base} does not exist on this "
                             "machine; give an existing image file or directory")
    for number, text in d.files:
        source = _first_word(_substitute(text, values))
        if not glob.glob(source):
            raise UsageError(f"{path}:{number}: %files source {source} does not exist "
                             "(relative paths are taken from the current directory)")
    for number, name, args in d.sections:
        if name in SCRIPT_SECTIONS:
            _check_shell(path, number, name, args,
                         _substitute("\n".join(d.bodies[number]), values))


def _check_shell(path: Path, number: int, name: str, args: str, body: str) -> None:
    """``sh -n`` on one section (Apptainer runs it with /bin/sh unless ``-c SHELL``);
    a syntax error becomes file:line of the offending line, counted from the section."""
    words = shlex.split(args) if args else []
    shell = words[words.index("-c") + 1] if "-c" in words[:-1] else "/bin/sh"
    if Path(shell).name not in ("sh", "bash", "dash", "ash", "ksh", "zsh"):
        return  # e.g. %post -c /usr/bin/python3: not ours to parse
    interpreter = shutil.which(Path(shell).name) or shutil.which("sh")
    if interpreter is None:
        return
    proc = subprocess.run([interpreter, "-n"], input=body + "\n", capture_output=True,
                          text=True, timeout=30)
    if proc.returncode == 0:
        return
    message = (proc.stderr.strip().splitlines() or ["syntax error"])[0]
    # dash: "sh: 3: Syntax error: ..."; bash: "bash: line 3: syntax error ..."
    found = re.match(r"[^:]*:\s*(?:line\s+)?(\d+):\s*(.*)", message)
    line, what = (number + int(found.group(1)), found.group(2)) if found else (number, message)
    raise UsageError(f"{path}:{line}: shell syntax error in %{name} (the section starts at "
                     f"line {number}): {what}; check it with `{Path(shell).name} -n`")


def _substitute(text: str, values: dict[str, str]) -> str:
    return TEMPLATE.sub(lambda m: values.get(m.group(1), m.group(0)), text)
