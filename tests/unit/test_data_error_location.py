"""A data error during training names the file and line of the plugin's own code the failed
sample went through, in this process and from DataLoader worker processes: the dataset is
an installed plugin's (a dist-info with a `ddl` entry point), read through ddl's real
loaders. Code of no plugin (a test's own dataset) gets no location."""

from __future__ import annotations

import importlib

import pytest

from conftest import install_plugin
from ddl.worker.train.loaders import train_loader
from ddl.worker.train.samples import SampleError

pytestmark = pytest.mark.unit

DATASETS = """
import torch
from ddl.contract.errors import DataError


def _parse(index):
    if index == 5:
        raise DataError("row 5 of train.csv has 3 fields, not 9")  # line 8
    return torch.zeros(2)


class Rows:
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return _parse(index)
"""


@pytest.fixture
def plugin_rows(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install_plugin(site, "located_plugin", DATASETS)
    monkeypatch.syspath_prepend(str(site))  # where importlib.metadata finds the entry point
    return importlib.import_module("located_plugin").Rows()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failed_sample_names_the_plugins_file_and_line(plugin_rows, workers):
    loader = train_loader(plugin_rows, batch_size=8, replicas=1, rank=0, seed=0,
                          workers=workers, pin_memory=False)
    with pytest.raises(SampleError) as caught:
        next(iter(loader))
    line = caught.value.line
    assert line.startswith("the train split's "), line  # sample order: the sampler's shuffle
    assert line.endswith(" failed: DataError: row 5 of train.csv has 3 fields, not 9 (at "
                         "located_plugin.py:8 in _parse) (datasets(); its __len__ says 8)"), line


def test_code_outside_any_plugin_gets_no_location():
    class Local:
        def __len__(self):
            return 4

        def __getitem__(self, index):
            raise ValueError("unreadable")

    loader = train_loader(Local(), batch_size=4, replicas=1, rank=0, seed=0, workers=0,
                          pin_memory=False)
    with pytest.raises(SampleError) as caught:
        next(iter(loader))
    assert " (at " not in caught.value.line and "ValueError: unreadable" in caught.value.line
