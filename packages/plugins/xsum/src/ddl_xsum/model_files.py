"""Which T5 xsum trains, from which files: the architecture from the data directory's
config, and the pretrained weights ddl loads after the build (each rank only its shard).

    xsum/models/t5-base/            config + safetensors (`ddl prepare`): pretrained
    xsum/models/t5-large/, t5-3b/   the same when `ddl prepare --preset NAME` fetched them;
                                    absent: random initialisation, with a one-line note
    xsum/models/synthetic-t5-*/     config only: random initialisation (tests may add
                                    safetensors beside it: then loaded like the real ones)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ddl_xsum import data

if TYPE_CHECKING:
    from ddl_xsum.workload import XsumWorkload

SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
# the released T5 checkpoints' embedding rows (google-t5 configs' vocab_size)
T5_VOCABULARY = 32128


def build(workload: XsumWorkload, data_dir: Path) -> nn.Module:
    """The preset's T5, freshly initialised (seeded alike on every rank by ddl); ddl then
    replaces the initial values with the pretrained weights where :func:`pretrained_weights`
    names some."""
    from transformers import T5Config, T5ForConditionalGeneration

    name = workload.model_name
    if not data.xsum_dir(data_dir).is_dir():
        # no data at all (`ddl plan`, a submit's fit check; a run's pre-flight wants
        # data first): the architecture alone, with T5's released vocabulary
        return T5ForConditionalGeneration(_no_cache(data.t5_config(name, T5_VOCABULARY)))
    synthetic = data.is_synthetic(data_dir)
    where = data.model_dir(data_dir, name, synthetic)
    if not synthetic and name in data.LARGE_HUB_MODELS and not where.exists():
        context = workload.context
        if context is None or context.world.rank == 0:
            print(f"ddl: xsum: no pretrained {name} in {where} (`ddl prepare --plugin xsum "
                  f"--preset {name}` fetches it on a login node); training from random "
                  "initialisation", flush=True)
        vocab = len(workload.tokenizer(data_dir))
        return T5ForConditionalGeneration(_no_cache(data.t5_config(name, vocab)))
    if _safetensors(where) is None and not synthetic \
            and name in {**data.HUB_MODELS, **data.LARGE_HUB_MODELS}:
        # weights in an older format than safetensors: Hugging Face loads them whole.
        # use_cache=False as in the course: no key/value cache during training.
        return T5ForConditionalGeneration.from_pretrained(
            str(where), use_cache=False, dtype=torch.float32, local_files_only=True)
    config = T5Config.from_pretrained(str(where), use_cache=False, local_files_only=True)
    return T5ForConditionalGeneration(config)


def pretrained_weights(name: str, data_dir: Path | None) -> Path | None:
    """The model directory when it holds safetensors, else None."""
    if data_dir is None or not data.xsum_dir(data_dir).is_dir():
        return None
    return _safetensors(data.model_dir(data_dir, name, data.is_synthetic(data_dir)))


def _safetensors(where: Path) -> Path | None:
    return where if any((where / f).is_file() for f in SAFETENSORS) else None


def _no_cache(config):
    config.use_cache = False
    return config
