"""The container part of a job's launch line: ``srun ... <runtime> run [--nv|--rocm]
[-B binds] IMAGE train ...``.

The runtime is the site's (``apptainer`` on JSC; ``singularity`` on LUMI, where
``apptainer`` may not exist), the GPU flag follows the site's accelerator (``--nv`` binds
NVIDIA's driver libraries into the container, ``--rocm`` AMD's), and the binds are the
site profile's ``container.binds`` (on LUMI the file systems and the Slingshot libraries
the RCCL plugin needs). The rendezvous is derived by the batch script outside the
container, where ``scontrol`` exists; Apptainer passes the environment through.
"""

from __future__ import annotations

import shlex

from ddl.errors import UsageError
from ddl.sites import SiteProfile

GPU_FLAGS = {"cuda": "--nv", "rocm": "--rocm"}


def image_for(site: SiteProfile, given: str) -> str:
    """``--container IMAGE``, or with the flag alone (``given == ""``) the site's image."""
    if given:
        return given
    if not site.container.image:
        raise UsageError(f"--container: site {site.name} has no default image "
                         "(container.image in its profile); give --container IMAGE")
    return site.container.image


def entry(site: SiteProfile, image: str) -> list[str]:
    """Shell words (quoted) that start ``ddl`` inside the image; ``train ...`` follows."""
    words = [site.container.runtime, "run"]
    if site.accelerator in GPU_FLAGS:
        words.append(GPU_FLAGS[site.accelerator])
    if site.container.binds:
        words += ["-B", shlex.quote(",".join(site.container.binds))]
    return words + [shlex.quote(image)]
