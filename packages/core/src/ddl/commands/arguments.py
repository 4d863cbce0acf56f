"""The flags ``ddl train`` shares with ``submit`` and ``scale`` (:func:`add_train_flags`), and
the types of flag values that need more than ``int`` or ``str``: KEY=VALUE, --mesh,
--device (with the ROCm spellings), names and directories that may not be empty. Each type
refuses a bad value with a one-line reason. No torch: ``ddl --help`` must answer at once."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def mesh_degrees(text: str) -> dict[str, int] | str:
    if text == "auto":  # ddl train: the layout `ddl plan` ranks first (commands/auto_layout)
        return text
    mesh: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not DIM=N with N >= 1 "
                                             "(e.g. dp=2,tp=2)")
        if name in mesh:  # a dict would keep the last silently
            raise argparse.ArgumentTypeError(f"{name!r} is named twice in {text!r}; "
                                             "allowed: each dimension once")
        mesh[name] = int(size)
    return mesh


#: What users of AMD GPUs (LUMI) type for the GPU device; torch's ROCm build drives them
#: through the ``cuda`` device type, so each means ``--device cuda``.
DEVICE_ALIASES = {"rocm": "cuda", "hip": "cuda", "gpu": "cuda"}
DEVICES = ("auto", "cpu", "cuda")


def device(text: str) -> str:
    if text in DEVICES:
        return text
    if text.lower() in DEVICE_ALIASES:
        return DEVICE_ALIASES[text.lower()]
    shown = text if len(text) <= 40 else f"{text[:40]}..."
    near = difflib.get_close_matches(text.lower(), [*DEVICES, *DEVICE_ALIASES], n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise argparse.ArgumentTypeError(
        f"invalid choice: {shown!r}; {hint}allowed: {', '.join(DEVICES)} (rocm, hip and gpu "
        "mean cuda: torch drives AMD GPUs as cuda devices)")


def nonempty_name(text: str) -> str:
    """A name flag's value (--preset): an empty one is refused, not read as the default."""
    if not text:
        raise argparse.ArgumentTypeError("an empty name; allowed: a name (leave the flag out "
                                         "for the default)")
    return text


def directory(text: str) -> Path:
    """A directory flag's path; an empty one is refused (Path("") is the current directory,
    so `--run-dir ''` would write a run into it)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path would mean the current directory; "
                                         "allowed: a directory name ('.' to mean the current "
                                         "one)")
    return Path(text)


def add_train_flags(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS  # only flags actually given override the config file and site
    p.add_argument("--config", type=Path, default=S, help="TOML file of run settings")
    p.add_argument("--plugin", default=S, help="workload plugin (default: mnist)")
    p.add_argument("--strategy", default=S, help="parallelism strategy (default: ddp; with "
                   "--mesh alone: mesh, which composes whatever --mesh names)")
    p.add_argument("--site", default=S, help="site profile (default: auto, the profile "
                   "whose detect rules match this machine, else local)")
    p.add_argument("--preset", type=nonempty_name, default=S,
                   help="workload size preset (default: the course's)")
    p.add_argument("--mesh", type=mesh_degrees, default=S, metavar="DIM=N,...",
                   help="parallel degrees by name (pp, dp_replicate, dp_shard, tp; dp = the "
                        "strategy's data parallelism): pp=2,tp=2,dp_shard=2 (3-D), "
                        "dp_replicate=2,dp_shard=2 (HSDP); the unnamed rest is dp_shard")
    p.add_argument("--microbatches", type=int, default=S,
                   help="pipeline microbatches per step (pp; default: 2 x stages)")
    p.add_argument("--strategy-option", dest="strategy_options", action="append",
                   type=key_value, default=S, metavar="KEY=VALUE",
                   help="strategy setting, repeatable (see `ddl plugins`)")
    p.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=S,
                   help="BatchNorm statistics over the whole global batch, not each rank's "
                        "share (data-parallel strategies; default: off)")
    p.add_argument("--nproc", type=int, default=S,
                   help="local worker processes (default: the site's, 2 on `local`)")
    p.add_argument("--epochs", type=int, default=S, help="default: the preset's")
    # both together: gradient accumulation (ddl.settings.batch.resolve_batch)
    p.add_argument("--batch-size", type=int, default=S,
                   help="samples per replica per forward pass (default: the preset's)")
    p.add_argument("--global-batch-size", type=int, default=S,
                   help="samples per optimizer step over all replicas; keeps runs with "
                        "different layouts comparable; with --batch-size, gradients are "
                        "accumulated over global / (batch x replicas) micro-steps")
    p.add_argument("--activation-checkpointing", choices=["none", "full", "selective"],
                   default=S, help="recompute activations in the backward, per block unit: "
                                   "full or selective (default: none)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=S,
                   help="torch.compile each block unit of the model (default: off)")
    p.add_argument("--lr", type=float, default=S, help="learning rate (default: the preset's)")
    p.add_argument("--lr-scaling", choices=["none", "linear"], default=S,
                   help="linear: lr x global batch / preset batch (default: none)")
    p.add_argument("--clip-grad-norm", type=float, default=S, metavar="MAX",
                   help="scale gradients to a global 2-norm of at most MAX (default: off)")
    p.add_argument("--lr-schedule", choices=["workload", "constant", "cosine", "linear", "step"],
                   default=S, help="shape after warm-up (default: the workload's own; "
                                   "cosine/linear decay to 0 at the last step)")
    p.add_argument("--warmup-steps", type=int, default=S,
                   help="linear learning-rate warm-up in optimizer steps")
    p.add_argument("--warmup-epochs", type=float, default=S,
                   help="linear learning-rate warm-up length (default: 0)")
    p.add_argument("--seed", type=int, default=S, help="default: 1, as in the courses")
    p.add_argument("--data-dir", type=directory, default=S,
                   help="default: the site's (./data)")
    p.add_argument("--run-dir", type=directory, default=S,
                   help="where results go (default: runs/<plugin>-<strategy>-<time>)")
    p.add_argument("--workers", type=int, default=S, help="DataLoader workers per process")
    p.add_argument("--steps-per-epoch", type=int, default=S,
                   help="cap on training steps per epoch (quick checks)")
    p.add_argument("--eval-samples", type=int, default=S, metavar="N",
                   help="validate and test on the first N samples of each split "
                        "(quick checks; default: all)")
    p.add_argument("--log-every", type=int, default=S, help="steps between progress lines")
    p.add_argument("--check-every", type=int, default=S, metavar="STEPS",
                   help="steps between checks for a non-finite loss or a stop request "
                        "(default: 10; also before checkpoints and at epoch ends)")
    p.add_argument("--live-every", type=float, default=S, metavar="SECONDS",
                   help="seconds between writes of each rank's live state for ddl watch "
                        "(default: 2; longer beyond 256 ranks, ~128 files a second in all)")
    p.add_argument("--profile", type=int, nargs="?", const=5, default=S, metavar="STEPS",
                   help="trace STEPS training steps per rank with torch.profiler (default "
                        "5, after 2 skipped): trace-rank<r>.json + a summary in results.json")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=S,
                   help="on GPUs, fp32 matrix products on tensor cores (TF32; default: on; "
                        "--no-tf32 keeps full fp32 where autocast leaves it)")
    p.add_argument("--count-syncs", action=argparse.BooleanOptionalAction, default=S,
                   help="count each step's host-device synchronisations on rank 0 and say "
                        "where they come from (results.json step_breakdown.syncs)")
    p.add_argument("--checkpoint-every", type=int, default=S, metavar="STEPS",
                   help="optimizer steps between checkpoints (default: every epoch's end)")
    p.add_argument("--keep-checkpoints", type=int, default=S, metavar="K",
                   help="newest checkpoints kept (default: 2; 0 = none)")
    p.add_argument("--async-checkpoint", action=argparse.BooleanOptionalAction, default=S,
                   help="write checkpoints while training goes on, from a host copy of the "
                        "state (default: off; docs/checkpoints.md)")
    p.add_argument("--max-restarts", type=int, default=S, metavar="N",
                   help="restart failed workers up to N times, resuming from the newest "
                        "checkpoint (local and torchrun launchers; default: 0)")
    p.add_argument("--resume", default=S, metavar="auto|none|PATH",
                   help="auto: continue the run dir's newest checkpoint if any; PATH: start "
                        "from a checkpoint or run directory (any world size/strategy)")
    p.add_argument("--rendezvous-timeout", type=float, default=S, metavar="SECONDS",
                   help="how long ranks wait for each other at start-up before the run "
                        "fails naming the address and the ranks that arrived (default: 300)")
    p.add_argument("--hang-timeout", type=float, default=S, metavar="SECONDS",
                   help="a rank without a heartbeat this long counts as hung: the run ends "
                        "with one line naming it (default: 120; 0 = off, else at "
                        "least 1)")
    p.add_argument("--device", type=device, default=S, metavar="{auto,cpu,cuda}",
                   help="default: auto (the site's accelerator); rocm, hip and gpu mean "
                        "cuda (torch drives AMD GPUs as cuda devices)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default=S,
                   help="auto: bf16 on GPUs that have it, fp16 with loss scaling on older "
                        "GPUs, fp32 on CPU")
    p.add_argument("--launcher", choices=["auto", "local", "srun", "torchrun", "torchrun_jsc"],
                   default=S, help="how workers start (default: auto: local processes "
                   "outside Slurm, the site's style inside a job)")


#: An error line quotes the user's values; one this long is a paste or a runaway script,
#: and the "one line" would be as long: it is cut (issue 52). Messages that quote a value on
#: purpose cut it to about 40 characters themselves (ddl.launch.submit.shown).
LONGEST_WORD, KEPT = 200, 40


def bounded(message: str, longest: int = LONGEST_WORD, keep: int = KEPT) -> str:
    """``message`` with every run of non-blank characters longer than ``longest`` cut to
    its first ``keep`` characters and its length."""
    def cut(word: str) -> str:
        if len(word) <= longest:
            return word
        return f"{word[:keep]}...({len(word)} characters)"
    return " ".join(cut(word) for word in message.split(" "))
