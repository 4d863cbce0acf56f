"""Site profiles: the facts about one system (accelerators, collectives, launcher, defaults),
kept as validated TOML in ``sites/``.

Profiles are found, in this order (a later directory does not override an earlier one):
1. directories in ``$DDL_SITE_PATH`` (``os.pathsep``-separated);
2. directories returned by plugins' ``ddl_site_dirs`` hook;
3. the profiles shipped with ddl (``sites/`` of the checkout, or ``ddl/_sites`` in a wheel).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddl.errors import UsageError
from ddl.validation import one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SITE_PATH_ENV = "DDL_SITE_PATH"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SiteDefaults(_Strict):
    """Run settings a site supplies unless the config file or a flag says otherwise."""

    nproc: int | None = Field(None, ge=1, description="processes per node for local launches")
    data_dir: str | None = Field(None, description="where datasets live (relative: to the cwd)")
    workers: int | None = Field(None, ge=0, description="DataLoader workers per process")
    synthetic_if_missing: bool = Field(
        False, description="generate synthetic data when the default data dir is empty "
        "(laptops and CI only; clusters must say which `ddl prepare` to run)")


class SiteProfile(_Strict):
    name: str
    description: str
    accelerator: Literal["cpu", "cuda", "rocm"]
    backend: Literal["gloo", "nccl"] = Field(
        description="torch.distributed backend; 'nccl' also means RCCL on ROCm builds")
    launcher: Literal["local"] = Field(
        "local", description="how workers start; 'local': torch's elastic launcher on this host")
    defaults: SiteDefaults = SiteDefaults()
    source: str = Field("", exclude=True, description="file the profile was read from")


def _builtin_dir() -> Path:
    packaged = Path(__file__).with_name("_sites")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[4] / "sites"  # editable install in a checkout


def site_dirs(plugins=None) -> list[Path]:
    dirs = [Path(p) for p in os.environ.get(SITE_PATH_ENV, "").split(os.pathsep) if p]
    if plugins is not None:
        dirs += [Path(d) for d in plugins.site_dirs()]
    dirs.append(_builtin_dir())
    return dirs


def _profile_files(plugins=None) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in site_dirs(plugins):
        for path in sorted(directory.glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def load_profile(path: Path) -> SiteProfile:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not a readable TOML file: {exc}") from None
    try:
        profile = SiteProfile.model_validate({**data, "source": str(path)})
    except ValidationError as exc:
        raise UsageError(one_line(exc, SiteProfile, where=str(path), key_style="key")) from None
    if profile.name != path.stem:
        raise UsageError(f"{path}: name {profile.name!r} must match the file name {path.stem!r}")
    return profile


def known_sites(plugins=None) -> dict[str, Path]:
    return _profile_files(plugins)


def get_site(name: str, plugins=None) -> SiteProfile:
    files = _profile_files(plugins)
    if name not in files:
        raise UsageError(f"--site: unknown site {name!r}; allowed: {', '.join(sorted(files))}")
    return load_profile(files[name])
