"""The run configuration: one validated description of a training run.

Values merge in this order, each later source overriding the earlier ones:

1. ddl's built-in defaults (the field defaults below);
2. the site profile's ``[defaults]`` table;
3. the workload preset's training defaults (epochs, batch size, learning rate), where the
   run gives none;
4. the config file given with ``--config`` (TOML, keys as the flag names with ``_``);
5. command-line flags.

The merged config is written to ``config.json`` in the run directory; what the worker
derives from it (per-replica and global batch, scaled learning rate, world size) is recorded
under ``resolved`` in ``results.json``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from ddl.contract.errors import UsageError
from ddl.settings.sites import SiteProfile
from ddl.settings.validation import one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


#: Bounds that keep an absurd number from starting thousands of processes or a loop no run
#: ends (``--nproc 100000``, ``epochs = 99999999999999999999``); far above any real run.
MAX_NPROC = 256  # processes per node; the largest nodes ddl knows have 8 GPUs
MAX_COUNT = 10**9  # epochs, steps, batch sizes
# Far above any real learning rate, yet finite when linearly scaled: a diverging run is
# stopped by the step guard in one line (tests/distributed/test_reliability.py uses 1e30)
MAX_LR = 1e30
MAX_SECONDS = 86400  # timeouts: a day
#: The shortest --hang-timeout that works: its heartbeat's store connection must come up
#: within it (0.001 s failed every run with the store's C++ error).
MIN_HANG_TIMEOUT = 1
#: Other names for the GPU device (``device = "rocm"`` in a config file; the flag's are
#: ddl.commands.parser.DEVICE_ALIASES, the same): torch's ROCm build drives AMD GPUs
#: through the ``cuda`` device type.
DEVICE_ALIASES = {"rocm": "cuda", "hip": "cuda", "gpu": "cuda"}


class RunConfig(BaseModel):
    # strict: `epochs = true` or `lr = "0.1"` in a config file is refused, not converted
    # (paths alone are converted from text: TOML and JSON have no path type)
    model_config = ConfigDict(extra="forbid", strict=True)

    plugin: str = Field("mnist", description="workload plugin")
    strategy: str = Field("ddp", description="parallelism strategy (default: ddp; 'mesh' "
                          "where --mesh is given without it)")
    site: str = Field("auto", description="site profile; 'auto' detects it")
    launcher: Literal["auto", "local", "srun", "torchrun", "torchrun_jsc"] = Field(
        "auto", description="'auto': local processes outside Slurm, the site's style inside")
    preset: str | None = Field(None, min_length=1,
                               description="workload size preset (default: the course's)")
    nproc: int | None = Field(None, ge=1, le=MAX_NPROC,
                              description="worker processes per node")
    epochs: int | None = Field(None, ge=1, le=MAX_COUNT)
    batch_size: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="samples per replica per forward pass (a "
        "micro-step when --global-batch-size asks for more)")
    global_batch_size: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="samples per optimizer step over all replicas; "
        "with --batch-size, gradients of global / (batch x data-parallel degree) micro-steps "
        "are accumulated per optimizer step")
    strategy_options: dict[str, str] = Field(
        default_factory=dict, description="strategy-specific settings (KEY=VALUE)")
    mesh: dict[str, Annotated[int, Field(ge=1, le=MAX_COUNT)]] = Field(
        default_factory=dict, description="parallel degrees by name, e.g. {dp: 2, tp: 2}; "
        "the strategy fills in what is missing from the world size")
    microbatches: int | None = Field(None, ge=1, le=MAX_COUNT,
                                     description="pipeline microbatches per step")
    sync_bn: bool = Field(False, description="BatchNorm statistics over the whole global batch "
                          "(all data-parallel ranks), not each rank's share")
    lr: float | None = Field(None, gt=0, le=MAX_LR, allow_inf_nan=False,
                             description="learning rate before scaling")
    lr_scaling: Literal["none", "linear"] = Field(
        "none", description="'linear': lr x global batch / the preset's batch (Goyal et al. 2017)")
    warmup_epochs: float = Field(0.0, ge=0, le=MAX_COUNT, allow_inf_nan=False,
                                 description="linear learning-rate warm-up")
    warmup_steps: int | None = Field(
        None, ge=0, le=MAX_COUNT, description="linear learning-rate warm-up in optimizer "
        "steps (instead of --warmup-epochs)")
    lr_schedule: Literal["workload", "constant", "cosine", "linear", "step"] = Field(
        "workload", description="learning-rate shape after warm-up: the workload's own "
        "(default), constant, cosine or linear to 0, step (x0.1 at 1/2, x0.01 at 3/4)")
    clip_grad_norm: float | None = Field(
        None, gt=0, le=MAX_COUNT, allow_inf_nan=False, description="scale gradients to "
        "this global 2-norm at most (over the whole model, whatever the strategy)")
    activation_checkpointing: Literal["none", "full", "selective"] = Field(
        "none", description="recompute activations in the backward pass, per block unit of "
        "the workload: full (keep only each unit's inputs) or selective (keep matrix "
        "products and convolutions, recompute the cheap ops)")
    compile: bool = Field(False, description="torch.compile each block unit of the workload "
                          "(regional compilation)")
    # torch generators take 64-bit seeds; ranks and epochs are added to this one
    seed: int = Field(1, ge=0, le=2**63 - 1)
    data_dir: Path | None = Field(None, strict=False)
    run_dir: Path | None = Field(None, strict=False,
                                 description="default: runs/<plugin>-<strategy>-<time>")
    workers: int | None = Field(None, ge=0, le=MAX_NPROC,
                                description="DataLoader workers per process")
    steps_per_epoch: int | None = Field(None, ge=1, le=MAX_COUNT,
                                        description="cap on training steps per epoch")
    eval_samples: int | None = Field(None, ge=1, le=MAX_COUNT,
                                     description="validate and test on the first N samples "
                                                 "of each split (default: all)")
    log_every: int = Field(50, ge=1, le=MAX_COUNT, description="steps between progress lines")
    check_every: int = Field(
        10, ge=1, le=MAX_COUNT, description="optimizer steps between the checks for a "
        "non-finite loss and a stop request (one small all-reduce and a host sync each; "
        "also before every checkpoint and at each epoch's end)")
    live_every: float | None = Field(
        None, ge=0.5, le=MAX_SECONDS, allow_inf_nan=False, description="seconds between two "
        "writes of each rank's live-state file (ddl watch); default: 2, longer beyond 256 "
        "ranks so that the job replaces at most ~128 files a second "
        "(ddl.settings.plan.live_interval)")
    profile: int = Field(0, ge=0, le=MAX_COUNT, description="training steps traced by "
                         "torch.profiler on every rank (0 = off; ddl.worker.observe.profiling)")
    tf32: bool = Field(True, description="fp32 matrix products on a GPU's tensor cores "
                       "(TF32; no effect on CPUs; ddl.worker.train.precision.allow_tf32)")
    count_syncs: bool = Field(False, description="count the host-device synchronisations "
                              "of every step (rank 0; ddl.worker.observe.step_breakdown)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="autocast dtype: auto = bf16 on GPUs with bf16, fp16 (+ grad "
        "scaler) on older GPUs, fp32 on CPU")
    checkpoint_every: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="optimizer steps between checkpoints (default: "
        "at the end of every epoch only)")
    keep_checkpoints: int = Field(2, ge=0, le=MAX_COUNT,
                                  description="newest checkpoints kept; 0 = none written")
    async_checkpoint: bool = Field(False, description="write checkpoints in a thread while "
                                   "training goes on (ddl.worker.checkpointing.checkpoint_writer)")
    resume: str = Field(
        "none", min_length=1, description="'auto': continue from this run dir's newest "
        "checkpoint if it has one; a checkpoint or run directory: start from it; 'none'")
    max_restarts: int = Field(
        0, ge=0, le=1000, description="times the launcher restarts failed workers (local and "
        "torchrun launchers); restarted workers resume from the newest checkpoint")
    synthetic_if_missing: bool = Field(
        False, description="generate synthetic data if the site's default data dir is empty")
    rendezvous_timeout: float = Field(
        300, ge=1, le=MAX_SECONDS, description="seconds all ranks have to meet at "
        "MASTER_ADDR:MASTER_PORT before the run fails naming the address and how many ranks "
        "arrived")

    hang_timeout: float = Field(
        120, ge=0, le=MAX_SECONDS, description="seconds without a heartbeat after which a "
        f"rank counts as hung (stopped, a frozen node) and the run ends naming it; 0 = off, "
        f"else at least {MIN_HANG_TIMEOUT}")

    @field_validator("data_dir", "run_dir", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, str) and not value:  # Path("") is "." : a run into the cwd
            raise PydanticCustomError("empty_path", "an empty path would mean the current "
                                      "directory; allowed: a directory name ('.' to mean "
                                      "the current one)")
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _device_alias(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in DEVICE_ALIASES:
            return DEVICE_ALIASES[value.lower()]
        return value

    @field_validator("hang_timeout")
    @classmethod
    def _hang_floor(cls, value: float) -> float:
        if 0 < value < MIN_HANG_TIMEOUT:
            raise PydanticCustomError(
                "hang_floor", f"too short for the heartbeat to connect; allowed: 0 (off) or "
                f"{MIN_HANG_TIMEOUT} to {MAX_SECONDS} seconds")
        return value

    @model_validator(mode="after")
    def _one_warmup_flag(self) -> RunConfig:
        if self.warmup_steps is not None and self.warmup_epochs:
            raise ValueError("give --warmup-steps or --warmup-epochs, not both")
        return self


@dataclass(frozen=True)
class Built:
    config: RunConfig
    site: SiteProfile  # the profile config.site names: loaded here, once per command
    data_dir_is_default: bool  # only then may synthetic data be generated into it
    site_note: str  # which site, and why (auto-detection says what matched)


def load_config_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))  # TOML is UTF-8 by definition
    except FileNotFoundError:
        raise UsageError(f"--config: file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"--config: {path} is not a readable TOML file: {exc}") from None
    unknown = sorted(set(data) - set(RunConfig.model_fields))
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r}; allowed: "
                         f"{', '.join(sorted(RunConfig.model_fields))}")
    # The file whole, on its own: a bad value is refused even where a flag overrides that
    # key (`epochs = "three"` with --epochs 2), since the file is wrong for its next use.
    try:
        RunConfig.model_validate(data)
    except ValidationError as exc:
        raise UsageError(one_line(exc, RunConfig, where=str(path))) from None
    return data


def build(flags: dict[str, Any], file_values: dict[str, Any] | None = None,
          plugins=None) -> Built:
    """Merge site defaults, the config file and flags into a validated RunConfig.

    Preset defaults are applied by the pre-flight, once the layout is known (see
    :func:`ddl.settings.batch.resolve_batch`).
    """
    from ddl.settings.sites import detect_profile, get_site

    user = {**(file_values or {}), **flags}
    if user.get("mesh") == "auto":  # ddl train resolves it before it gets here
        raise UsageError("--mesh auto: only `ddl train` chooses a layout itself; for a job, "
                         "run `ddl plan` and pass the --mesh it prints")
    try:
        first = RunConfig.model_validate(user)  # validates names and types before lookups
    except ValidationError as exc:
        raise UsageError(one_line(exc, RunConfig, where="")) from None

    if first.site == "auto":
        site, why = detect_profile(plugins)
        site_note = f"site auto -> {site.name} ({why})"
    else:
        site = get_site(first.site, plugins)  # an alias names the profile that lists it
        shown = first.site if first.site == site.name else f"{first.site} = {site.name}"
        site_note = f"site {shown} (given)"
    user["site"] = site.name
    merged: dict[str, Any] = site.defaults.model_dump(exclude_none=True)
    merged.update(user)
    if merged.get("mesh") and "strategy" not in merged:
        merged["strategy"] = "mesh"  # --mesh alone: the layout says everything
    data_dir_is_default = "data_dir" not in user
    merged.setdefault("data_dir", "data")
    try:
        return Built(RunConfig.model_validate(merged), site, data_dir_is_default, site_note)
    except ValidationError as exc:
        raise UsageError(one_line(exc, RunConfig, where="")) from None


def check_names(config: RunConfig, plugins) -> None:
    """The plugin, strategy and preset asked for, against what is installed: checked
    before the pre-flight imports torch, so a misspelt name costs a fraction of a second
    (measured: 0.2 s against 2.5 s) and says the same one line."""
    workload = plugins.workload(config.plugin)
    plugins.strategy(config.strategy)
    preset_name(config, workload)


def preset_name(config: RunConfig, spec) -> str:
    """The name of the workload preset the run uses: the one asked for, else the
    workload's default (the course's); an unknown one is one line."""
    name = config.preset or spec.default_preset
    if name not in spec.presets:
        shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}...({len(name)} characters)"
        raise UsageError(f"--preset: {config.plugin} has no preset {shown}; allowed: "
                         f"{', '.join(spec.presets)}")
    return name


def resolve_preset(config: RunConfig, spec) -> tuple[str, Any]:
    """(name, Preset) of the workload preset the run uses (:func:`preset_name`)."""
    name = preset_name(config, spec)
    return name, spec.presets[name]


def scaled_lr(config: RunConfig, base_lr: float, global_batch: int, preset_batch: int) -> float:
    """The linear scaling rule: lr grows with the global batch relative to the course's."""
    if config.lr_scaling == "linear":
        return base_lr * global_batch / preset_batch
    return base_lr
