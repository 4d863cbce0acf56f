"""The site profile's environment (``[env]``), for the GPUs a job has.

Two places use it: ``ddl submit`` writes the variables into the batch script, and ``ddl
train`` sets them itself inside a job (:func:`in_job`), so that a run started by a
hand-written ``srun ... ddl train --site lumi`` (or ``srun singularity run IMG train``)
gets the same NCCL/RCCL and MIOpen settings as a submitted one.

The profile describes a whole node. A job that asks for fewer GPUs (``--gpus-per-node 2``)
gets the first that many entries of the device lists: exporting all four of JSC's devices
to a two-GPU job hands torch devices it may not use. (The srun CPU masks are cut the same
way, by ddl.settings.cores, where a rank's cores are decided.)
"""

from __future__ import annotations

import os
import string
from collections.abc import Mapping

from ddl.settings.sites import SiteProfile

#: The variables that list devices by index, one entry per GPU of the node.
DEVICE_LISTS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def variables(site: SiteProfile, gpus: int | None = None) -> dict[str, str]:
    """``site.env``, device lists cut to ``gpus`` entries (None: the whole node)."""
    env = dict(site.env)
    for name in DEVICE_LISTS:
        if gpus and name in env and "," in env[name]:
            env[name] = ",".join(env[name].split(",")[:gpus])
    return env


def in_job(site: SiteProfile, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The site's variables this process lacks, expanded as the batch shell would expand
    them (``${USER}``, ``${SLURM_JOB_ID}``, an earlier variable of the profile). Variables
    already set win: the batch script's, the user's, Slurm's own device list."""
    seen = dict(env)
    added: dict[str, str] = {}
    for name, value in site.env.items():
        if name in seen:
            continue
        seen[name] = added[name] = string.Template(value).safe_substitute(seen)
    return added
