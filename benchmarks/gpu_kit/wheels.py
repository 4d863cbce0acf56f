"""The wheels a GPU machine without a package registry needs, and ddl's install there.

``fetch`` (here, with network) fills ``benchmarks/gpu_wheels/``:

- ``runtime/``: what ddl and its plugins import that the GPU machine's image lacks. The list
  is the difference between ddl's requirements (packages/*/pyproject.toml) and the image's
  package list (2026-11, /work/.library/device/KINDS.md): pydantic and its three helpers,
  datasets with dill and multiprocess, rouge-score with nltk and defusedxml; and
  typing-extensions, which the image has but perhaps older than pydantic needs (>= 4.16; a
  newer one keeps the old API). Everything else
  (torch, transformers, tokenizers, pyarrow, pandas, xxhash, fsspec, pluggy, psutil, numpy,
  pillow, absl-py, nvidia-ml-py, ...) is there. Versions are the ones installed beside this
  interpreter (the development venv), so the GPU run imports what the tests ran against.
- ``build/``: hatchling and its requirements, the build backend of ddl's packages: pip
  builds them from the checkout in an isolated environment that it fills from this folder.

``install`` (there, offline) installs ``runtime/`` and then ddl's packages from the checkout,
all with ``--no-deps`` so the image's torch (2.11, not the dev pin) stays as it is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

RUNTIME = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection",
           "typing-extensions", "datasets", "dill", "multiprocess", "rouge-score", "nltk",
           "defusedxml"]
BUILD = ["hatchling", "packaging", "pathspec", "pluggy", "tomlkit", "trove-classifiers"]
SDIST_ONLY = {"rouge-score"}  # no wheel on PyPI: built here (pure Python, any platform)
# pip matches manylinux tags exactly; these cover the wheels of the packages above.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
LIMIT_BYTES = 60 * 2 ** 20  # what travels with a run is capped at 64 MiB, the checkout too


def _pinned(name: str) -> str:
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def fetch(target: Path, python_version: str) -> dict:
    """Download into ``target`` (emptied first: two versions of a wheel stop an install)."""
    if target.exists():
        shutil.rmtree(target)
    (target / "runtime").mkdir(parents=True)
    (target / "build").mkdir()
    (target / ".gitignore").write_text("*\n")  # never committed; carried to the GPU machine
    names = RUNTIME + (["tomli"] if tuple(map(int, python_version.split("."))) < (3, 11) else [])
    pip = [sys.executable, "-m", "pip"]
    binary = [n for n in names if n not in SDIST_ONLY]
    platform = [a for p in PLATFORMS for a in ("--platform", p)]
    for folder, wanted in (("runtime", binary), ("build", BUILD)):
        subprocess.run([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", python_version, "--implementation", "cp",
                        *platform, "-d", str(target / folder), *map(_pinned, wanted)],
                       check=True)
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", str(target / "runtime"),
                    *map(_pinned, sorted(SDIST_ONLY & set(names)))], check=True)
    wheels = sorted(target.glob("*/*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    if size > LIMIT_BYTES:
        raise SystemExit(f"--fetch-wheels: {size / 2 ** 20:.1f} MiB of wheels in {target}; "
                         f"at most {LIMIT_BYTES / 2 ** 20:.0f} MiB travel with a GPU run")
    return {"folder": str(target), "wheels": [w.name for w in wheels], "bytes": size}


def install_command(wheels: Path, repo: Path) -> list[str]:
    """One pip command: the carried runtime wheels, then ddl's packages built from the
    checkout (build requirements from ``build/``), nothing from an index."""
    runtime = sorted((wheels / "runtime").glob("*.whl"))
    if not runtime or not any((wheels / "build").glob("hatchling-*.whl")):
        raise FileNotFoundError(f"no wheels in {wheels}/runtime or no hatchling in "
                                f"{wheels}/build: run `gpu_check.py --fetch-wheels` where "
                                "pip can reach a registry, and bring the folder along")
    packages = [repo / "packages" / "core", *sorted((repo / "packages" / "plugins").iterdir())]
    # --force-reinstall: the same version number of ddl may hold other code (the checkout's)
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
               "--force-reinstall",
               "--find-links", str(wheels / "build"), "--disable-pip-version-check"]
    if sys.prefix == sys.base_prefix and (Path(sysconfig.get_path("stdlib"))
                                          / "EXTERNALLY-MANAGED").exists():
        command.append("--break-system-packages")  # a throw-away machine's system Python
    return [*command, *map(str, runtime), *map(str, packages)]
