"""requirements.lock against what ddl's packages and requirements-dev.txt ask for.

The lock (scripts/lock.py writes it) must pin every third-party package the dev/CI venv
needs, each with a hash, at a version every requirement accepts, and nothing more. The
requirements come from the real files: requirements-dev.txt, packages/*/pyproject.toml, and
the metadata of the packages installed in this venv (which scripts/bootstrap.sh installed
from the lock; the test also checks that it did). The checks are run on altered copies too,
to show they catch a raised floor, a missing package and a stale entry.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
LOCK_SCRIPT = REPO / "scripts" / "lock.py"
ENTRY = re.compile(r"^([a-z0-9][a-z0-9-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*$")


def locked_versions(text: str) -> dict[str, str]:
    """name -> version of every entry; each must be `name==version --hash=sha256:...`."""
    versions = {}
    for entry in text.replace("\\\n", " ").splitlines():
        if not entry.strip() or entry.startswith("#"):
            continue
        match = ENTRY.match(entry)
        assert match, f"not a canonical 'name==version --hash=sha256:...' entry: {entry!r}"
        assert match[1] not in versions, f"{match[1]} is locked twice"
        versions[match[1]] = match[2]
    return versions


def own_distributions() -> dict[str, dict]:
    """ddl's distributions: canonical name -> [project] table of packages/**/pyproject.toml."""
    tables = {}
    for path in [REPO / "packages/core/pyproject.toml",
                 *sorted(REPO.glob("packages/plugins/*/pyproject.toml"))]:
        project = tomllib.loads(path.read_text())["project"]
        tables[canonicalize_name(project["name"])] = {**project, "dir": path.parent}
    return tables


def dev_requirements() -> tuple[list[Requirement], dict[Path, set[str]]]:
    """requirements-dev.txt: its third-party requirements, and each -e directory's extras."""
    third_party, editable = [], {}
    for line in (REPO / "requirements-dev.txt").read_text().splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e "):
            path, _, extras = line[3:].strip().partition("[")
            editable[(REPO / path).resolve()] = set(filter(None, extras.rstrip("]").split(",")))
        else:
            third_party.append(Requirement(line))
    return third_party, editable


def roots(dists: dict[str, dict]) -> list[tuple[Requirement, str]]:
    """What the venv installs directly, each with where it was asked for."""
    third_party, editable = dev_requirements()
    out = [(req, "requirements-dev.txt") for req in third_party]
    for name, project in dists.items():
        extras = editable[project["dir"].resolve()]
        for spec in project.get("dependencies", []):
            out.append((Requirement(spec), name))
        for extra, specs in project.get("optional-dependencies", {}).items():
            # extras the venv does not install are checked only where their package is locked
            out += [(Requirement(spec), f"{name}[{extra}]" + ("" if extra in extras else "?"))
                    for spec in specs]
    return out


def installed_requires(name: str) -> list[Requirement]:
    return [Requirement(spec) for spec in importlib.metadata.requires(name) or []]


def lock_problems(locked: dict[str, str], wanted: list[tuple[Requirement, str]],
                  own: set[str], requires=installed_requires) -> list[str]:
    """Walk the requirements from `wanted` through each locked package's own requirements:
    every one must be locked at a version it accepts, and every locked package reached."""
    problems, reached, queue = [], set(), list(wanted)
    seen_extras: dict[str, set[str]] = {}
    while queue:
        req, origin = queue.pop()
        optional = origin.endswith("?")
        name = canonicalize_name(req.name)
        if name in own or (req.marker and not any(
                req.marker.evaluate({"extra": extra})
                for extra in seen_extras.get(origin.rstrip("?"), {""}) | {""})):
            continue
        if name not in locked:
            if not optional:
                problems.append(f"{name} ({req}, from {origin.rstrip('?')}) is not in the lock")
            continue
        if not req.specifier.contains(locked[name], prereleases=True):
            problems.append(f"{origin.rstrip('?')} wants {req}, the lock has "
                            f"{name}=={locked[name]}")
        if optional:
            continue  # a locked package some uninstalled extra names: version checked only
        new_extras = set(req.extras) - seen_extras.get(name, set())
        if name in reached and not new_extras:
            continue
        reached.add(name)
        seen_extras.setdefault(name, set()).update(req.extras)
        queue += [(dep, name) for dep in requires(name)]
    problems += [f"{name}=={locked[name]} is locked but nothing needs it"
                 for name in sorted(set(locked) - reached)]
    return problems


def _check(locked=None, wanted=None):
    dists = own_distributions()
    return lock_problems(locked if locked is not None else locked_versions(LOCK.read_text()),
                         wanted if wanted is not None else roots(dists), set(dists))


def test_every_entry_is_pinned_with_a_hash_and_none_is_ddls_own():
    locked = locked_versions(LOCK.read_text())
    assert len(locked) > 50 and {"torch", "numpy", "pydantic", "transformers"} <= set(locked)
    assert not set(locked) & set(own_distributions())


def test_the_lock_is_for_this_interpreter_python_3_11():
    assert "# lock-environment: cpython 3.11 linux x86_64\n" in LOCK.read_text()
    proc = subprocess.run([sys.executable, str(LOCK_SCRIPT), "check-python"],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_another_interpreter_gets_one_line(tmp_path):
    other = tmp_path / "requirements.lock"
    other.write_text(LOCK.read_text().replace("lock-environment: cpython 3.11 ",
                                              "lock-environment: cpython 3.13 "))
    proc = subprocess.run([sys.executable, str(LOCK_SCRIPT), "check-python", "--lock",
                           str(other)], capture_output=True, text=True)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "is for cpython 3.13 linux x86_64, this is cpython 3.11" in proc.stderr


def test_every_ddl_package_is_installed_by_the_dev_requirements():
    _, editable = dev_requirements()
    assert {p["dir"].resolve() for p in own_distributions().values()} == set(editable)


def test_this_venv_holds_the_locked_versions():
    """The closure below reads each package's requirements from this venv: it must be the lock's
    (./run-tests and ./ddl reinstall from the lock when it changes)."""
    wrong = {name: (version, importlib.metadata.version(name))
             for name, version in locked_versions(LOCK.read_text()).items()
             if importlib.metadata.version(name) != version}
    assert not wrong, f"locked vs installed: {wrong}"


def test_requirements_and_the_lock_agree():
    assert _check() == []


def test_a_raised_floor_is_caught():
    dists = own_distributions()
    wanted = roots(dists) + [(Requirement("pydantic>=99"), "ddl")]
    locked = locked_versions(LOCK.read_text())
    assert _check(wanted=wanted) == [f"ddl wants pydantic>=99, the lock has "
                                     f"pydantic=={locked['pydantic']}"]


def test_a_missing_dependency_is_caught():
    locked = locked_versions(LOCK.read_text())
    del locked["tqdm"]  # huggingface-hub and others require it
    problems = _check(locked=locked)
    assert problems and all(p.startswith("tqdm (tqdm") for p in problems), problems


def test_a_stale_entry_is_caught():
    locked = {**locked_versions(LOCK.read_text()), "left-pad": "1.0"}
    assert _check(locked=locked) == ["left-pad==1.0 is locked but nothing needs it"]


def _constraints(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, str(LOCK_SCRIPT), "constraints", *args],
                          capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()


def test_image_constraints_leave_the_torch_stack_to_the_base_image():
    locked = locked_versions(LOCK.read_text())
    everything = _constraints("--all")
    assert everything == [f"{name}=={version}" for name, version in locked.items()]
    torch_stack = {line for line in everything
                   if re.match(r"(torch|torchvision|triton|nvidia-.*|cuda-.*)==", line)}
    assert {"torch==2.14.1", "torchvision==0.29.1"} <= torch_stack
    assert _constraints() == [line for line in everything if line not in torch_stack]


def test_the_bootstrap_fingerprint_covers_the_lock(tmp_path):
    """A changed lock makes ./ddl and ./run-tests reinstall the venv."""
    for path in ["scripts/bootstrap.sh", "requirements.lock", "requirements-dev.txt",
                 *[str(p.relative_to(REPO)) for p in REPO.glob("packages/**/pyproject.toml")
                   if ".venv" not in p.parts]]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)

    def fingerprint():
        return subprocess.run(["bash", str(tmp_path / "scripts/bootstrap.sh"), "--fingerprint"],
                              capture_output=True, text=True, check=True).stdout.strip()

    before = fingerprint()
    lock = tmp_path / "requirements.lock"
    lock.write_text(lock.read_text().replace("numpy==", "numpy==0", 1))
    assert re.fullmatch(r"[0-9a-f]{64}", before) and fingerprint() != before


def test_the_wheelhouse_carries_the_image_constraints(tmp_path):
    """scripts/build-wheelhouse.sh (the real one: builds ddl's wheels, ~5 s) writes the lock's
    versions, torch stack left out, where the container definitions look for them."""
    proc = subprocess.run([str(REPO / "scripts/build-wheelhouse.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "constraints.txt").read_text().splitlines() == _constraints()
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.whl")) == sorted(
        canonicalize_name(name).replace("-", "_") for name in own_distributions())
