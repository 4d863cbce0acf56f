"""Read checkpoint files without running code from them.

A pickle can call any importable function while it loads. DCP reads ``.metadata`` with a
plain ``pickle.load`` (torch.distributed.checkpoint.filesystem.FileSystemReader
.read_metadata, torch 2.x) and its DefaultLoadPlanner loads non-tensor items with
``torch.load(weights_only=False)``. ddl replaces both:

* ``.metadata`` is read by ``MetadataUnpickler``, whose ``find_class`` admits only DCP's
  metadata classes, torch.Size, torch dtypes and the layout helper they pickle; anything else
  (``os.system``, ``builtins.eval``, ...) is refused before it is called;
* non-tensor items (optimizer step counters, hyper-parameters) load with
  ``torch.load(weights_only=True)``, as DCP already loads tensors and ddl its RNG files.

``SafeReader``/``SafePlanner`` are what every DCP load of ddl passes; ``read_metadata`` is
also called before the load, so a refusal is one line rather than DCP's wrapped exception.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

METADATA = ".metadata"
_DCP = "torch.distributed.checkpoint."
_ALLOWED = {
    _DCP + "metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                        "TensorStorageMetadata", "BytesStorageMetadata",
                        "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    _DCP + "filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "Path"},  # StorageMeta's id
    "collections": {"OrderedDict"},
}


class UnsafeCheckpoint(ValueError):
    """A checkpoint file asked to run code (or is no checkpoint file at all)."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata and refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"{METADATA} asks to load {module}.{name}, which is not a "
                               "checkpoint metadata class; refused")


def read_metadata(directory: Path) -> Any:
    """``directory``'s DCP metadata through the allow-list; UnsafeCheckpoint when it holds
    anything else, is malformed or names data files outside the checkpoint."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(Path(directory) / METADATA, "rb") as f:
        try:
            metadata = MetadataUnpickler(f).load()
        except UnsafeCheckpoint:
            raise
        except Exception as exc:  # noqa: BLE001 - a torn pickle raises many kinds
            raise UnsafeCheckpoint(f"{METADATA} is not readable DCP metadata "
                                   f"({type(exc).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{METADATA} holds a {type(metadata).__name__}, not DCP metadata")
    for info in (metadata.storage_data or {}).values():
        name = str(getattr(info, "relative_path", ""))
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise UnsafeCheckpoint(f"{METADATA} names data file {name!r}, which is not a "
                                   "file of the checkpoint directory")
    return metadata


def load_weights_only(path: Path) -> Any:
    """torch.load(weights_only=True) of a ddl file (RNG states); UnsafeCheckpoint when the
    file holds anything else or is damaged."""
    import torch

    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - UnpicklingError; RuntimeError for a torn zip
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
        raise UnsafeCheckpoint(f"{Path(path).name} is not a weights-only file: "
                               f"{type(exc).__name__}{': ' + reason if reason else ''}") from None


def reader(directory: Path):
    """A DCP FileSystemReader whose metadata goes through the allow-list."""
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata = read_metadata(Path(self.path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(directory)


def planner():
    """DCP's default load planner with non-tensor items loaded weights-only."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict,
                            self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafePlanner()
