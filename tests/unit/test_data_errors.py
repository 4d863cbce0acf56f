"""Data errors name the split and the sample, through ddl's real loaders (ddl.worker.train.loaders),
in this process and across DataLoader worker processes; and the one-line summary of the
failed ranks (ddl.worker.process.crash.summary) that the local launcher prints."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from ddl.contract.errors import DataError
from ddl.worker.process.crash import summary
from ddl.worker.train.loaders import eval_loader, train_loader
from ddl.worker.train.samples import SampleError

pytestmark = pytest.mark.unit


class Lying(Dataset):
    """40 samples, a __len__ of 44."""

    def __init__(self) -> None:
        self.data = TensorDataset(torch.arange(40.0).unsqueeze(1))

    def __len__(self) -> int:
        return 44

    def __getitem__(self, index):
        return self.data[index]


class Ragged(Dataset):
    """Sample 5 is one element longer than the others."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index):
        return torch.zeros(4 if index == 5 else 3)


class Unreadable(Dataset):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index):
        if index == 2:
            raise self.error
        return torch.zeros(1)


def _first_error(loader) -> SampleError:
    with pytest.raises(SampleError) as caught:
        for _ in loader:
            pass
    return caught.value


@pytest.mark.parametrize("workers", [0, 2])
def test_lying_len_names_split_and_index_also_from_loader_processes(workers):
    loader = train_loader(Lying(), batch_size=4, replicas=1, rank=0, seed=0,
                          workers=workers, pin_memory=False)
    line = _first_error(loader).line
    index = int(line.split("sample ")[1].split()[0])
    assert 40 <= index < 44, line
    assert line == (f"the train split's sample {index} failed: IndexError: index {index} is "
                    "out of bounds for dimension 0 with size 40 (datasets(); its __len__ "
                    "says 44)")


def test_samples_that_do_not_stack_name_the_batch_and_the_odd_sample():
    loader = eval_loader(Ragged(), batch_size=8, replicas=1, rank=0, workers=0,
                         pin_memory=False, split="val")
    line = _first_error(loader).line
    assert line.startswith("the val split's batch of samples 0, 1, 2, 3, 4, 5, 6, 7 failed: "
                           "RuntimeError: stack expects each tensor to be equal size"), line
    assert "entry 5 is sample 5" in line and line.endswith("; datasets())")


def test_the_original_error_is_kept_as_the_cause_ddl_errors_included():
    loader = eval_loader(Unreadable(ValueError("bad pixel\nsecond line")), batch_size=4,
                         replicas=1, rank=0, workers=0, pin_memory=False)
    error = _first_error(loader)
    assert error.line == ("the evaluation split's sample 2 failed: ValueError: bad pixel "
                          "(datasets(); its __len__ says 4)")
    assert isinstance(error.__cause__, ValueError)
    broken = DataError("corrupt file x.bin: truncated")
    loader = eval_loader(Unreadable(broken), batch_size=4, replicas=1, rank=0, workers=0,
                         pin_memory=False, split="test")
    error = _first_error(loader)
    assert error.line.startswith("the test split's sample 2 failed: DataError: corrupt file "
                                 "x.bin: truncated")
    assert error.__cause__ is broken


def test_a_sample_error_survives_pickling():
    error = SampleError("the train split's sample 3 failed: KeyError: 'x' (datasets())")
    assert pickle.loads(pickle.dumps(error)).line == error.line


def _record(what: str, rank: int) -> dict:
    return {"subject": "plugin 'gpt'", "what": what, "rest": "IndexError: out of range",
            "traceback": f"/runs/r/logs/rank{rank}-traceback.txt"}


def test_summary_merges_ranks_and_names_the_first_failure():
    same = {r: _record("forward() in a training step", r) for r in range(64)}
    assert summary(same, first=7) == (
        "plugin 'gpt': forward() in a training step failed on ranks 0-63: IndexError: out "
        "of range; tracebacks: /runs/r/logs/rank<N>-traceback.txt")
    mixed = {0: _record("the val split's sample 8", 0), 1: _record("the val split's sample 9", 1)}
    assert summary(mixed, first=1) == (
        "plugin 'gpt': the val split's sample 9 failed on rank 1: IndexError: out of range; "
        "also rank 0: the val split's sample 8; tracebacks: /runs/r/logs/rank<N>-traceback.txt")
    assert summary({3: _record("datasets() in set-up", 3)}).endswith(
        "failed on rank 3: IndexError: out of range; traceback: "
        "/runs/r/logs/rank3-traceback.txt")
