"""Pretrained weights in Hugging Face's safetensors format, read one tensor at a time.

A model directory holds either ``model.safetensors`` or shards named by
``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file), as
``save_pretrained`` writes them. ``read(name)`` memory-maps the shard and copies out that
one tensor, so loading never holds more than the largest tensor beside what the rank keeps
(ddl.worker.build.materialize cuts its slice).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class WeightsFile:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        index = self.directory / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._where = {name: self.directory / shard for name, shard in weight_map.items()}
        else:
            from safetensors import safe_open

            path = self.directory / SINGLE
            with safe_open(str(path), framework="pt") as f:
                self._where = {name: path for name in f.keys()}

    @staticmethod
    def found(directory: Path) -> bool:
        return (Path(directory) / INDEX).is_file() or (Path(directory) / SINGLE).is_file()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self._where[name]), framework="pt") as f:
            return f.get_tensor(name)
