"""The workload interface: what a model-and-data plugin implements.

A workload is built by its spec's factory with a :class:`ddl.contract.specs.Preset`. The trainer only
talks to this interface, so a third-party workload trains under every strategy whose
requirements it meets.

Batches are ``(inputs, targets)`` pairs as the workload's datasets and default collation give
them; :meth:`Workload.to_device` is the place to adapt that, and :meth:`Workload.forward` how
the model is called - except under a pipeline (``pp`` >= 2), which never calls ``forward``:
it feeds the inputs to :meth:`Workload.pipeline_stages` in turn.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from ddl.contract.context import RunContext
    from ddl.contract.specs import Preset

SPLITS = ("train", "val", "test")


class Workload(ABC):
    #: The run this workload is part of (ddl.contract.context.RunContext): set by the
    #: trainer before datasets() (step counts still None) and, complete, before
    #: build_model() and optimizer(). None outside a run (listings, the kit's first checks).
    context: RunContext | None = None

    def __init__(self, preset: Preset) -> None:
        self.preset = preset

    # --- data -------------------------------------------------------------------------
    #: Dotted name of the module that knows the data's on-disk layout. The default data
    #: methods below call its ``check_files(data_dir)``, ``download(data_dir) -> Path``
    #: and ``is_synthetic(data_dir) -> bool``; override a method instead where it needs
    #: more than the data directory.
    data_module: str = ""
    #: Dotted name of the module whose ``write_synthetic(data_dir) -> Path`` generates a
    #: learnable stand-in in the same layout (``ddl prepare --synthetic``).
    synthetic_module: str = ""
    #: Convolutional models: on a CUDA device ddl stores the model's 4-D weights channels
    #: last (NHWC) before the strategy wraps it, which cuDNN's tensor-core convolutions
    #: run fastest; the first convolution then turns the inputs NHWC too. The same
    #: arithmetic in another memory order: results agree within fp32 rounding (on a CPU,
    #: where torch has both layouts, tests/unit/test_channels_last.py compares them).
    channels_last: bool = False

    def _module(self, attribute: str) -> Any:
        from importlib import import_module

        name = getattr(self, attribute)
        if not name:  # an author's mistake, not a user's: a plain TypeError
            raise TypeError(f"{type(self).__name__} sets no {attribute}; set it or override "
                            "the data methods (check_data, prepare, is_synthetic)")
        return import_module(name)

    def check_data(self, data_dir: Path) -> None:
        """Raise :class:`ddl.contract.errors.DataError` (one line, naming the ``ddl prepare``
        command; :class:`~ddl.contract.errors.DataMissing` if there is no data at all)
        unless ``data_dir`` holds a complete, readable copy of the data. Runs before any
        worker starts; keep it cheap."""
        self._module("data_module").check_files(data_dir)

    def prepare(self, data_dir: Path, *, synthetic: bool) -> Path:
        """Fetch the official data (login node, network) or, with ``synthetic``, generate a
        learnable stand-in in the same on-disk format. Safe to re-run."""
        if synthetic:
            return self._module("synthetic_module").write_synthetic(data_dir)
        return self._module("data_module").download(data_dir)

    def is_synthetic(self, data_dir: Path) -> bool:
        """Whether ``data_dir`` holds generated data (recorded in results.json); False for
        a workload without a data module."""
        return bool(self.data_module) and self._module("data_module").is_synthetic(data_dir)

    @abstractmethod
    def datasets(self, data_dir: Path) -> dict[str, Dataset]:
        """The ``train``, ``val`` and ``test`` datasets, read from their real format."""

    def holdout_splits(self, train: Dataset, test: Dataset, val_fraction: float,
                       val_view: Dataset | None = None) -> dict[str, Dataset]:
        """The three splits of a data set without a validation split (MNIST, CIFAR-10): the
        last ``val_fraction`` of ``train`` is held out as ``val``, fixed, like Keras'
        ``validation_split``; ``val_view`` reads those samples another way (the eval
        transform) if given. The preset options ``train_samples`` and ``eval_samples`` cut
        the splits to prefixes (small presets)."""
        from torch.utils.data import Subset

        n_val = int(len(train) * val_fraction)
        n_train = len(train) - n_val
        indices = {"train": range(n_train), "val": range(n_train, len(train)),
                   "test": range(len(test))}
        options = self.preset.options
        for split, limit in (("train", "train_samples"), ("val", "eval_samples"),
                             ("test", "eval_samples")):
            if limit in options:
                indices[split] = indices[split][: options[limit]]
        sources = {"train": train, "val": train if val_view is None else val_view, "test": test}
        return {split: Subset(sources[split], indices[split]) for split in SPLITS}

    # --- model, loss, metrics -----------------------------------------------------------
    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (the caller seeds the RNG identically on all ranks)."""

    @abstractmethod
    def loss(self, outputs: Any, targets: Any) -> torch.Tensor:
        """Mean loss over the batch; what the optimizer minimises."""

    @abstractmethod
    def sample_metrics(self, outputs: Any, targets: Any) -> dict[str, torch.Tensor]:
        """Per-sample metric values (shape ``[batch]``), including ``loss``. The trainer sums
        them over all ranks and divides by the sample count, so evaluation is exact for any
        world size."""

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """Metrics computed from the exact means over all ranks and samples, added beside
        them (e.g. ``{"perplexity": math.exp(means["loss"])}``): a function of a mean is not
        the mean of per-sample values. None by default."""
        return {}

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        """The outputs :meth:`loss` and :meth:`sample_metrics` receive; ``model`` is the
        wrapped model (DDP, FSDP, tensor parallel). A pipeline (``pp`` >= 2) never calls it:
        it runs the :meth:`pipeline_stages` on the inputs, the last stage's output going
        to :meth:`loss`, so anything done here besides ``model(inputs)`` must be in the
        stages too. Default: ``model(inputs)``."""
        return model(inputs)

    def to_device(self, batch: Any, device: torch.device) -> tuple[Any, Any]:
        """``(inputs, targets)`` on ``device`` from a collated batch, for every strategy
        (pipelines too) and for evaluation; override for batches that are not two
        tensors (dicts)."""
        inputs, targets = batch
        return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    # --- optimisation -------------------------------------------------------------------
    @abstractmethod
    def optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
        """The course's optimizer for these parameters at this learning rate (``params``:
        what :meth:`param_groups` made of them, else a list of this rank's parameters)."""

    def param_groups(self, named: list[tuple[str, Any]]) -> list[dict[str, Any]] | None:
        """Optimizer parameter groups made from ``(name, parameter)`` pairs, the names as in
        the model :meth:`build_model` returned, whatever the strategy wrapped around it
        (e.g. no weight decay for names ending in ``bias``). Only this rank's parameters
        appear (a pipeline stage's, sharded ones as DTensors). None (the default): one
        group of all parameters."""
        return None

    def lr_factor(self, epoch: int) -> float:
        """Per-epoch learning-rate multiplier (e.g. StepLR's gamma ** epoch); 1 by default.
        Used through :meth:`lr_step_factor`, under ``--lr-schedule workload`` (the default)."""
        return 1.0

    def lr_step_factor(self, step: int) -> float:
        """Learning-rate multiplier at optimizer step ``step``, counted from 0 over the whole
        run (to ``self.context.total_steps - 1``; a resumed run goes on from where it was),
        for per-step schedules (warm-up, cosine to ``total_steps``). Called under
        ``--lr-schedule workload`` (the default), times ddl's own ``--warmup-*`` ramp if
        asked for. Default: :meth:`lr_factor` of the step's epoch."""
        return self.lr_factor(step // self.context.steps_per_epoch)

    def pretrained_weights(self) -> Path | None:
        """A directory of pretrained weights in Hugging Face's safetensors format
        (``model.safetensors`` or a sharded ``model.safetensors.index.json``) whose tensor
        names are the state-dict names of :meth:`build_model`'s model; None (the default):
        the built values are the initial weights. ddl loads them after the build, each
        rank reading only the tensors it keeps (ddl.worker.build.materialize). Tensors the file
        lacks keep the built values; tied weights may be stored under any of their names."""
        return None

    # --- measurement and parallelism hints ------------------------------------------------
    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward + backward) per sample, for MFU; None if unknown."""
        return None

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """Sub-modules FSDP shards as units of their own (ResNet stages, transformer blocks).
        Declare the ``fsdp_units`` capability in the spec when overriding."""
        return []

    def tp_plan(self, model: nn.Module) -> dict[str, str]:
        """Tensor-parallel plan: module path -> ``"colwise"`` or ``"rowwise"`` (Megatron
        style: column-parallel in, row-parallel out). Capability ``tp_plan``."""
        return {}

    def prepare_tensor_parallel(self, model: nn.Module, tp_degree: int) -> None:
        """Adjust, in place, attributes that count heads or widths, which become per-rank
        values once the projections are split over ``tp_degree`` ranks (e.g. an attention
        module's ``n_heads``); raise UsageError when ``tp_degree`` does not divide them.
        Called before the plan is applied: once on the whole model on the meta device
        before workers start, then on each rank's part - the whole model, or under pp x tp
        each pipeline stage the rank holds (a module :meth:`pipeline_stages` returned),
        so look the attributes up in what it is given, not by whole-model paths."""

    def pipeline_splits(self, model: nn.Module) -> list[str]:
        """Names of top-level children where a new pipeline stage may begin, in order.
        Capability ``pipeline_splits``. The default :meth:`pipeline_stages` needs a model
        whose forward is its top-level children applied in order (nn.Sequential-like)."""
        return []

    def pipeline_costs(self, model: nn.Module) -> list[float] | None:
        """What each segment between split points costs (``len(pipeline_splits) + 1``
        numbers, in order), for :meth:`pipeline_cut` to balance: e.g. forward FLOPs per
        sample where the workload knows them. None (the default): each segment's
        parameters (:func:`segment_parameters`), the model state a stage holds."""
        return None

    def pipeline_cut(self, model: nn.Module, n_stages: int) -> list[str]:
        """The ``n_stages - 1`` split points where stages 2.. begin: the cut whose largest
        stage costs least (:meth:`pipeline_costs`, default parameters; :func:`balanced_cut`);
        among equal ones the most even, then the one nearest an even spread of the points.
        Raises UsageError when there are fewer split points than cuts."""
        splits = self.pipeline_splits(model)
        if n_stages - 1 > len(splits):
            from ddl.contract.errors import UsageError
            raise UsageError(f"{n_stages} pipeline stages need {n_stages - 1} split points; "
                             f"this workload has {len(splits)} ({', '.join(splits) or 'none'})"
                             f"; allowed: at most {len(splits) + 1} stages")
        costs = self.pipeline_costs(model)
        if costs is None:
            costs = segment_parameters(model, splits)
        return [splits[j - 1] for j in balanced_cut(costs, n_stages)]

    def pipeline_stages(self, model: nn.Module, n_stages: int) -> list[nn.Module]:
        """The model cut into ``n_stages`` modules; stage i's output is stage i+1's input,
        the last stage's output goes to :meth:`loss`. Default: cut the top-level children
        at the split points :meth:`pipeline_cut` chooses (balanced by parameters, or by
        :meth:`pipeline_costs`). Override for models that are not sequential (e.g. an
        encoder-decoder)."""
        from collections import OrderedDict

        from torch import nn

        chosen = set(self.pipeline_cut(model, n_stages))
        stages: list[list[tuple[str, nn.Module]]] = [[]]
        for name, child in model.named_children():
            if name in chosen:
                stages.append([])
            stages[-1].append((name, child))
        return [nn.Sequential(OrderedDict(children)) for children in stages]

    def test_report(self, model: nn.Module, dataset: Dataset, world: Any,
                    whole_model: Callable[[], nn.Module | None]) -> dict[str, Any]:
        """Optional extra test metrics computed once after training (e.g. ROUGE on generated
        summaries). Called on every rank with the evaluation module. For loops of your own
        (``generate()``) call ``whole_model()`` on every rank (a collective): a whole model
        every rank holds as plain tensors (share the samples out over the ranks), or None
        where the parameters stay distributed (tensor parallel: every rank then runs
        ``model`` on the same inputs). Return the same dict everywhere (reduce across
        ranks yourself) or {} to skip."""
        return {}


def segment_parameters(model: nn.Module, splits: list[str]) -> list[float]:
    """Parameters (elements) of each segment between ``splits`` (module paths where a
    segment begins, in the model's registration order, which a pipeline's forward
    follows); a weight tied between segments counts where it is first registered."""
    counts = [0.0] * (len(splits) + 1)
    segment = 0
    for name, param in model.named_parameters():
        for j in range(segment, len(splits)):  # a split without parameters is passed over
            if name == splits[j] or name.startswith(splits[j] + "."):
                segment = j + 1
        counts[segment] += param.numel()
    return counts


def balanced_cut(costs: list[float], n_stages: int) -> list[int]:
    """Where ``n_stages`` stages of consecutive segments begin (segment indices 1..
    ``len(costs) - 1``, increasing): the cut whose most costly stage costs least (a
    pipeline runs at its slowest stage's pace and holds its largest stage's state);
    among those the smallest sum of squared stage costs (the most even), then the cut
    nearest ``round(i (len(costs)) / n_stages)``, the even spread by index. Exact: two
    dynamic programmes over (stages, segments), no search."""
    k = len(costs)
    if not 1 <= n_stages <= k:
        raise ValueError(f"{n_stages} stages of {k} segments")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(i: int, j: int) -> float:  # segments i..j-1
        return prefix[j] - prefix[i]

    inf = float("inf")
    # 1. the least possible largest stage
    best = [[inf] * (k + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, n_stages + 1):
        for j in range(s, k - (n_stages - s) + 1):
            best[s][j] = min(max(best[s - 1][i], cost(i, j)) for i in range(s - 1, j))
    limit = best[n_stages][k]
    tol = 1e-9 * max(abs(limit), 1.0)
    # 2. under that limit: the smallest sum of squares, then the nearest to even by index
    key: list[list[tuple[float, float] | None]] = [[None] * (k + 1)
                                                   for _ in range(n_stages + 1)]
    back = [[0] * (k + 1) for _ in range(n_stages + 1)]
    key[0][0] = (0.0, 0.0)
    for s in range(1, n_stages + 1):
        even = s * k / n_stages
        for j in range(s, k - (n_stages - s) + 1):
            for i in range(s - 1, j):
                prev, c = key[s - 1][i], cost(i, j)
                if prev is None or c > limit + tol:
                    continue
                off = abs(j - even) if s < n_stages else 0.0
                cand = (prev[0] + c * c, prev[1] + off)
                if key[s][j] is None or cand < key[s][j]:
                    key[s][j], back[s][j] = cand, i
    cuts, j = [], k
    for s in range(n_stages, 1, -1):
        j = back[s][j]
        cuts.append(j)
    return cuts[::-1]
