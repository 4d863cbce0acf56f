"""Data errors that name the split and the sample.

A dataset whose ``__getitem__`` raises, whose ``__len__`` claims more samples than it has
(an IndexError late in an epoch) or whose samples do not stack into a batch otherwise fails
deep inside the DataLoader, often in a loader process, with nothing saying which split or
sample. :class:`GuardedDataset` and :class:`GuardedCollate` turn such a failure into a
:class:`SampleError` naming both, and the file and line of the plugin's code a failed
sample went through. The cost is one ``try`` per batch: samples are fetched in
``__getitems__`` (torch's batched fetch), and a batch remembers its indices for the collate.
"""

from __future__ import annotations

import re
from typing import Any

from ddl.contract.errors import as_one_line
from ddl.worker.process.plugin_code import plugin_location

#: eval_loader serves both evaluation splits; the crash report names the one that failed
#: from where it happened (validation or the test) when the loader was not told.
UNNAMED = "evaluation"


class SampleError(Exception):
    """A sample (or a batch of samples) of a split could not be read or collated.

    Built from one string, because a DataLoader worker process sends an exception back as its
    class and its formatted traceback and re-creates it with that text as the only argument.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)

    @property
    def line(self) -> str:
        """The one-line description, also from the text a loader worker sent back (whose
        last line is ``ddl.worker.train.samples.SampleError: <description>``)."""
        last = (str(self).strip().splitlines() or [""])[-1]
        prefix = f"{type(self).__module__}.{type(self).__qualname__}: "
        return last.removeprefix(prefix)


def _what(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return as_one_line(f"{type(exc).__name__}: {first}"[:300])


class _Batch(list):
    """The samples of one batch and the indices they were read from."""

    indices: list[int]


class GuardedDataset:
    """``dataset`` for a DataLoader, raising :class:`SampleError` when a sample fails.

    ddl's own errors (a DataError from a data-file helper, say) are wrapped too: raised on
    one rank only, or in a loader process, they would not reach the terminal as one line.
    """

    def __init__(self, dataset: Any, split: str) -> None:
        self.dataset = dataset
        self.split = split
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as exc:
            raise self.failed(index, exc) from exc

    def __getitems__(self, indices: list[int]) -> _Batch:
        many = getattr(self.dataset, "__getitems__", None)
        index = indices[0] if indices else 0
        try:
            if many:
                batch = _Batch(many(indices))
            else:
                batch = _Batch()
                for index in indices:
                    batch.append(self.dataset[index])
        except Exception as exc:
            raise self.failed(index if not many else indices, exc) from exc
        batch.indices = indices
        return batch

    def failed(self, where: int | list[int], exc: BaseException) -> SampleError:
        sample = f"sample {where}" if isinstance(where, int) else \
            f"batch of samples {_listed(where)}"
        return SampleError(f"the {self.split} split's {sample} failed: {_what(exc)}"
                           f"{plugin_location(exc.__traceback__)} "
                           f"(datasets(); its __len__ says {self.length})")


class GuardedCollate:
    """torch's default collate, raising :class:`SampleError` naming the batch's samples
    when they do not stack (samples of different shapes, say)."""

    def __init__(self, split: str) -> None:
        self.split = split

    def __call__(self, batch: list) -> Any:
        from torch.utils.data import default_collate

        try:
            return default_collate(batch)
        except Exception as exc:
            indices = getattr(batch, "indices", None)
            named = _entries(str(exc), indices) if indices else ""
            samples = f"samples {_listed(indices)}" if indices else f"{len(batch)} samples"
            raise SampleError(f"the {self.split} split's batch of {samples} failed: "
                              f"{_what(exc)} (collating the batch{named}; datasets())") from exc


def _listed(indices: list[int], most: int = 8) -> str:
    shown = ", ".join(str(i) for i in indices[:most])
    return shown + (f", ... ({len(indices)} in all)" if len(indices) > most else "")


def _entries(message: str, indices: list[int]) -> str:
    """torch names the positions in the batch ("at entry 5"); say which samples they are."""
    found = [int(n) for n in re.findall(r"at entry (\d+)", message)]
    named = [f"entry {n} is sample {indices[n]}" for n in found if n < len(indices)]
    return f": {', '.join(named)}" if named else ""
