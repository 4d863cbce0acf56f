"""The largest batch of a workload's preset that fits a fraction (0.8) of the GPU's memory:
doubling from the preset's batch, then bisecting, each try one training step (forward in
bf16 autocast, backward, the optimizer's step, so its state counts) on a batch made of 64
real training samples repeated. torch's peak allocation plus one copy of the parameters in
fp32 (DDP's gradient buckets, which this single-process probe does not build) must stay
within the fraction; an out-of-memory error counts as not fitting. The batch is also capped
by the data: an epoch of the bench data must hold at least 8 steps."""

from __future__ import annotations

import time

MIN_STEPS = 8  # steps per epoch the found batch must leave in the training split
MAX_TRIES = 14


def _tile(batch, n: int):
    """``batch`` (tensors, possibly nested in dicts, lists, tuples) repeated to ``n`` rows."""
    import torch

    if isinstance(batch, torch.Tensor):
        reps = -(-n // batch.shape[0])
        return batch.repeat(reps, *[1] * (batch.dim() - 1))[:n]
    if isinstance(batch, dict):
        return {k: _tile(v, n) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_tile(v, n) for v in batch)
    return batch


def largest(fits, start: int, ceiling: int, max_tries: int = MAX_TRIES) -> int:
    """The largest batch ``fits`` accepts, at most ``ceiling`` (0 if not even 1 does):
    doubling from ``start`` (halving from it if it does not fit), then bisecting between
    the last fit and the first failure to within 1/16 of the fit, or 8, on multiples of 8."""
    fit, fail, n, tries = 0, None, start, 0
    while tries < max_tries:
        tries += 1
        if fits(n):
            fit = n
            if n >= ceiling:
                break
            n = min(2 * n, ceiling)
        else:
            fail = n
            if fit or n == 1:
                break
            n //= 2
    while fail is not None and fit and tries < max_tries:
        mid = (fit + fail) // 2 // 8 * 8 or (fit + fail) // 2
        if fail - fit <= max(8, fit // 16) or mid <= fit:
            break
        tries += 1
        if fits(mid):
            fit = mid
        else:
            fail = mid
    return fit


def search(plugin: str, preset: str, data_dir: str, fraction: float = 0.8) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from ddl.contract.plugins import Plugins

    if not torch.cuda.is_available():
        raise SystemExit("batch-search: torch sees no GPU")
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    spec = Plugins().workload(plugin)
    chosen = spec.presets[preset]
    workload = spec.create(chosen)
    train = workload.datasets(__import__("pathlib").Path(data_dir))["train"]
    base = next(iter(DataLoader(train, batch_size=min(64, len(train)), shuffle=True)))
    model = workload.build_model().to(device)
    groups = workload.param_groups(list(model.named_parameters()))
    optimizer = workload.optimizer(list(model.parameters()) if groups is None else groups,
                                   chosen.lr)
    model.train()
    total = torch.cuda.get_device_properties(device).total_memory
    buckets = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    limit = fraction * total
    ceiling = max(8, len(train) // MIN_STEPS // 8 * 8)
    tries: list[str] = []
    peaks: dict[int, int] = {}

    def fits(n: int) -> bool:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        try:
            inputs, targets = workload.to_device(_tile(base, n), device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = workload.loss(workload.forward(model, inputs), targets)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) + buckets
            ok = peak <= limit
            peaks[n] = peak
            tries.append(f"{n}:{peak / 2 ** 30:.1f}GiB{'' if ok else '>limit'}"
                         f"({time.perf_counter() - t0:.1f}s)")
        except torch.cuda.OutOfMemoryError:
            ok = False
            tries.append(f"{n}:oom")
        finally:
            inputs = targets = loss = None  # noqa: F841 - free the try's tensors
            optimizer.zero_grad(set_to_none=True)
        return ok

    fit = largest(fits, min(chosen.batch_size, ceiling), ceiling)
    if not fit:
        raise SystemExit(f"batch-search: not even batch 1 fits {fraction:.0%} of the GPU "
                         f"({' '.join(tries)})")
    return {"plugin": plugin, "preset": preset, "batch_size": fit,
            "limited_by": "data" if fit >= ceiling else "memory",
            "data_ceiling": ceiling, "train_samples": len(train), "fraction": fraction,
            "device_memory_bytes": total, "peak_bytes_at_batch": peaks.get(fit),
            "ddp_bucket_bytes": buckets, "tries": " ".join(tries)}
