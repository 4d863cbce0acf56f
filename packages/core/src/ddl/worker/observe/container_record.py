"""results.json's ``container``: which image a run ran in, so a result can be traced to the
image and to the ddl commit it was built from (None outside a container).

The runtime sets ``APPTAINER_CONTAINER`` / ``SINGULARITY_CONTAINER`` to the image's host path
(ddl.launch.container_inside reads the same variables; the worker layer may not import it).
The build labels live in the image at ``/.singularity.d/labels.json`` (both runtimes);
ddl's images carry ``ddl.commit``, ``ddl.built``, ``ddl.version`` there. The image file's
size and modification time stand in for a digest: hashing a multi-GB image at every run
would cost seconds, and the file is often not visible inside (only bound paths are).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

RUNTIME_VARS = (("apptainer", "APPTAINER_CONTAINER"), ("singularity", "SINGULARITY_CONTAINER"))
LABELS = Path("/.singularity.d/labels.json")


def record(environ: dict[str, str] | None = None,
           labels_file: Path = LABELS) -> dict[str, Any] | None:
    env = os.environ if environ is None else environ
    runtime, image = next(((r, env[v]) for r, v in RUNTIME_VARS if env.get(v)), (None, None))
    if image is None:
        return None
    try:
        labels = json.loads(labels_file.read_text())
    except (OSError, ValueError):
        labels = {}
    try:
        stat = os.stat(image)
        file = {"size": stat.st_size,
                "mtime": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(stat.st_mtime))}
    except OSError:
        file = None  # not bound into the container
    return {"runtime": runtime, "image": image, "target": env.get("DDL_CONTAINER_TARGET"),
            "commit": labels.get("ddl.commit"), "built": labels.get("ddl.built"),
            "ddl_version": labels.get("ddl.version"), "file": file}
