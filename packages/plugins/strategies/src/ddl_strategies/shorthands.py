"""The named strategies: ddl_strategies.compose with a default layout each.

``--strategy NAME`` says which dimensions ``--mesh`` may set and how the world is filled
when it sets none; building and running is the one recipe in ddl_strategies.compose. Each
keeps the options that mean something to it.
"""

from __future__ import annotations

from ddl_strategies import ddp, fsdp, pipeline
from ddl_strategies.compose import MeshStrategy


class DDP(MeshStrategy):
    """Every rank a whole replica (``dp`` = dp_replicate)."""

    name = "ddp"
    mesh_dims = frozenset()
    dp_means = "dp_replicate"
    layout_fill = ("dp_replicate",)
    uses_microbatches = False
    options_help = ddp.OPTIONS_HELP


class FSDP(MeshStrategy):
    """FSDP over every rank; HSDP with ``--mesh dp_replicate=R,dp_shard=S``."""

    name = "fsdp"
    mesh_dims = frozenset({"dp", "dp_shard", "dp_replicate"})
    layout_fill = ("dp_shard", "dp_replicate")
    uses_microbatches = False
    options_help = fsdp.OPTIONS_HELP


class TensorParallel(MeshStrategy):
    """Tensor parallel over every rank (all ranks see the same batch)."""

    name = "tp"
    mesh_dims = frozenset()
    layout_fill = ("tp",)
    layout_minimum = {"tp": 2}
    uses_microbatches = False
    options_help: dict[str, str] = {}


class FSDPTensorParallel(MeshStrategy):
    """2-D: tensor parallel in groups of ``tp`` (default 2), FSDP over the rest."""

    name = "fsdp+tp"
    mesh_dims = frozenset({"dp", "dp_shard", "tp"})
    layout_fill = ("dp_shard", "tp")
    layout_defaults = {"tp": 2}
    uses_microbatches = False
    options_help = fsdp.OPTIONS_HELP


class Pipeline(MeshStrategy):
    """One pipeline over every rank; ``--mesh dp=D,pp=P``: D replicas of a P-stage one."""

    name = "pp"
    mesh_dims = frozenset({"dp", "dp_replicate", "pp"})
    dp_means = "dp_replicate"
    layout_fill = ("pp", "dp_replicate")
    layout_minimum = {"pp": 2}
    options_help = pipeline.OPTIONS_HELP
