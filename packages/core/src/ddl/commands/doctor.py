"""``ddl doctor``: check, on the node it runs on, what a job of this site needs.

One line per check (``ok``, ``FAIL`` or ``skip`` with the reason); the exit code is 1 if
anything failed. Run it on a login node before submitting and inside a job (``srun ddl
doctor``) when a job misbehaves; inside a container it checks the container's Python and
torch (``apptainer run IMAGE doctor --site SITE``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
from collections.abc import Callable
from pathlib import Path

from ddl.contract.errors import DdlError, UsageError
from ddl.launch import container_inside, environment

OK, FAIL, SKIP = "ok", "FAIL", "skip"


def _check_platform(site) -> tuple[str, str]:
    found = environment.machine()
    problem = environment.arch_mismatch(site, found)
    if problem:
        return FAIL, problem
    return OK, f"{found}" + (f", as {site.name} needs" if site.arch else "")


def _check_python() -> tuple[str, str]:
    try:
        environment.check_python()
    except DdlError as exc:
        return FAIL, str(exc)
    return OK, (f"Python {platform.python_version()} (ddl needs >= "
                f"{'.'.join(map(str, environment.PYTHON_FLOOR))})")


def _check_torch(site) -> tuple[str, str]:
    """The floor, and whether the build (CUDA, ROCm, CPU-only) fits the site's GPUs."""
    build = environment.installed_torch()
    try:
        environment.check_torch(build.version if build else None)
    except DdlError as exc:
        return FAIL, str(exc)
    problem = environment.build_mismatch(build, site.name, site.accelerator)
    if problem:
        return FAIL, problem
    floor = ".".join(map(str, environment.TORCH_FLOOR))
    short = [name for name in environment.STRATEGY_TORCH_FLOORS
             if _refuses(name, build.version)]
    return OK, (f"{build.describe()}, ddl needs >= {floor}"
                + (f"; too old for --strategy {', '.join(short)}" if short else ""))


def _refuses(strategy: str, version: str) -> bool:
    try:
        environment.check_strategy_torch(strategy, version)
    except DdlError:
        return True
    return False


def _check_devices(site) -> tuple[str, str]:
    import torch

    if site.accelerator == "cpu":
        return OK, f"CPU site; {os.cpu_count()} cores visible, torch {torch.__version__}"
    expected = None
    if site.partitions:
        expected = site.partitions[site.default_partition].gpus_per_node
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    found = environment.installed_torch()  # a +cpu build is neither CUDA nor ROCm
    build = found.describe() if found else f"torch {torch.__version__}"
    if "SLURM_JOB_ID" not in os.environ:
        return SKIP, f"not inside a job ({visible} GPU(s) visible here, {build})"
    if visible == 0:
        return FAIL, "no GPU visible to torch inside the job (check --gres/--gpus-per-node)"
    if expected and visible != expected:
        return FAIL, f"{visible} GPU(s) visible, the partition has {expected} per node"
    return OK, f"{visible} device(s) visible ({build})"


def _check_backend(site) -> tuple[str, str]:
    import torch.distributed as dist

    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}
    if available.get(site.backend):
        return OK, f"torch.distributed backend {site.backend} available"
    return FAIL, f"backend {site.backend} is not available in this torch build"


def _check_rendezvous(site) -> tuple[str, str]:
    from ddl.launch.rendezvous import expand_nodelist, resolve

    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return SKIP, "not inside a job: the rendezvous host is known only there"
    host = expand_nodelist(nodelist)[0] + site.rendezvous.host_suffix
    try:
        return OK, f"rendezvous host {host} resolves to {resolve(host)}"
    except DdlError as exc:
        return FAIL, str(exc)


def _check_data(data_dir: Path | None) -> tuple[str, str]:
    if data_dir is None:
        return SKIP, "no --data-dir given"
    if not data_dir.is_dir():
        container = container_inside.detect()
        if container:
            return FAIL, container_inside.missing_dir(data_dir, "data directory", container,
                                                      "run `ddl prepare` for it")
        return FAIL, f"data directory {data_dir} does not exist"
    if not os.access(data_dir, os.R_OK | os.X_OK):
        return FAIL, f"data directory {data_dir} is not readable"
    return OK, f"data directory {data_dir} is readable"


def _check_container(site) -> tuple[str, str]:
    inside = container_inside.detect()
    if inside:  # no runtime on PATH is expected here, not a failure
        wrong = inside.target and site.accelerator not in ("cpu", inside.target)
        if wrong:
            label = environment.GPU_LABEL[site.accelerator]
            return FAIL, (f"{inside.describe()}: a {inside.target} image cannot use "
                          f"{site.name}'s {label} GPUs; use a {site.accelerator} image")
        return OK, inside.describe()
    found = [n for n in ("apptainer", "singularity") if shutil.which(n)]
    if not found:  # a job without --container runs the venv: nothing missing for it
        return SKIP, ("neither apptainer nor singularity is on PATH: needed only by jobs "
                      "with --container")
    note = f"{', '.join(found)} found"
    if site.container.runtime not in found:
        note += f" (the site profile names {site.container.runtime})"
    return OK, note


def _check_offline(site) -> tuple[str, str]:
    if not site.offline:
        return SKIP, "site compute nodes are not marked offline"
    from ddl.launch.submit import HF_OFFLINE

    unset = [v for v in HF_OFFLINE if os.environ.get(v) != "1"]
    if not unset:
        return OK, "HF offline variables are set"
    if "SLURM_JOB_ID" not in os.environ:
        return SKIP, "offline site: jobs from `ddl submit` set " + ", ".join(HF_OFFLINE)
    return FAIL, f"offline site but {', '.join(unset)} not set to 1 in this job"


def _check_launcher(site) -> tuple[str, str]:
    if site.launcher != "torchrun_jsc":
        return SKIP, f"launcher {site.launcher} needs nothing extra"
    try:
        import torchrun_jsc  # noqa: F401
    except ImportError:
        return FAIL, "torchrun_jsc is not installed (pip install torchrun-jsc)"
    return OK, "torchrun_jsc installed"


def run_checks(site_name: str, data_dir: Path | None) -> int:
    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import detect_site, get_site

    plugins = Plugins()
    why = "given"
    if site_name == "auto":
        site_name, why = detect_site(plugins)
    site = get_site(site_name, plugins)
    print(f"{OK:<5}site: {site.name} ({why})")
    checks: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        ("platform", lambda: _check_platform(site)),
        ("python", _check_python),
        ("torch", lambda: _check_torch(site)),
        ("devices", lambda: _check_devices(site)),
        ("backend", lambda: _check_backend(site)),
        ("rendezvous", lambda: _check_rendezvous(site)),
        ("data", lambda: _check_data(data_dir)),
        ("container", lambda: _check_container(site)),
        ("offline", lambda: _check_offline(site)),
        ("launcher", lambda: _check_launcher(site)),
    ]
    failed = 0
    for name, check in checks:
        try:
            status, detail = check()
        except Exception as exc:  # a check that crashes is a failed check, not a traceback
            status, detail = FAIL, f"{type(exc).__name__}: {exc}"
        failed += status == FAIL
        print(f"{status:<5}{name}: {detail}")
    return 1 if failed else 0


def cmd_doctor(ns: argparse.Namespace) -> int:
    if getattr(ns, "collectives", False):
        return run_collectives(ns.site, ns.nproc, ns.format)
    for flag in ("nproc", "format"):
        if getattr(ns, flag, None) not in (None, "text"):
            raise UsageError(f"--{flag}: only with --collectives")
    return run_checks(ns.site, ns.data_dir)


def run_collectives(site_name: str, nproc: int | None, fmt: str = "text") -> int:
    """Time the collectives between local processes, fit latency and bandwidth, and print
    them next to the site profile's intra-node numbers (ddl.commands.collective_probe)."""
    import json

    from ddl.commands.flags import check_whole
    from ddl.contract.plugins import Plugins
    from ddl.settings.config import MAX_NPROC
    from ddl.settings.sites import detect_site, get_site

    check_whole("--nproc", nproc, MAX_NPROC)  # as ddl train: not 10^20 processes started
    if nproc is not None and nproc < 2:
        raise UsageError(f"--nproc: {nproc}; allowed: 2 or more (a collective needs two "
                         "processes)")
    plugins = Plugins()
    why = "given"
    if site_name == "auto":
        site_name, why = detect_site(plugins)
    site = get_site(site_name, plugins)
    import torch

    from ddl.commands import collective_probe

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus else "gloo"
    if nproc is None:
        nproc = gpus or max(site.defaults.nproc or 2, 2)
    if gpus and nproc > gpus:
        raise UsageError(f"--nproc: {nproc}; allowed: at most the {gpus} GPU(s) visible")
    measured = collective_probe.measure(nproc, backend)
    if backend == "gloo":  # what `ddl plan --site local` times this machine's layouts with
        from ddl.planning import cpu_calibration

        cpu_calibration.store_links(nproc, measured)
    measured["site"] = {"name": site.name, "intra_node_latency_s": site.intra_node_latency_s,
                        "intra_node_bytes_per_s": site.intra_node_bytes_per_s}
    if fmt == "json":
        print(json.dumps(measured, indent=2))
        return 0
    print(f"{OK:<5}site: {site.name} ({why})")
    print(f"collectives: {backend}, {nproc} processes on this node "
          f"({'GPU' if gpus else 'CPU'}), mean of {measured['repeats']} timings per size, "
          "the slowest left out")
    print(render_collectives(measured, site))
    skew = measured.get("skew")
    if skew:  # what `ddl plan` adds to a CPU step of several ranks (step_time_model)
        print(f"waiting for the slowest rank: +{skew['wait_per_compute']:.0%} of the compute "
              f"before a collective (a 4 KB all-reduce after {skew['compute_s'][0] * 1e3:.1f} "
              f"/ {skew['compute_s'][-1] * 1e3:.1f} ms of compute: "
              f"{skew['latency_s'][0] * 1e6:.0f} / {skew['latency_s'][-1] * 1e6:.0f} us)")
        if not skew.get("reliable", True):
            short, long = (t * 1e3 for t in skew["compute_s"])
            print(f"note: the two compute blocks took {short:.1f} and {long:.1f} ms in the last "
                  f"of {skew['attempts']} tries (under {collective_probe.SKEW_MIN_SPAN:g}x "
                  "apart: other work on these cores); not kept for `ddl plan`, which counts no "
                  "wait until a quieter `ddl doctor --collectives`")
    return 0


def render_collectives(measured: dict, site) -> str:
    sizes = list(next(iter(measured["seconds"].values())))
    heads = ["op", *(_size(int(n)) for n in sizes), "latency", "bandwidth", "worst fit"]
    rows = []
    for op, fit in measured["fits"].items():
        times = measured["seconds"].get(op)
        rows.append([op if op != "all" else "one fit for all",
                     *((f"{times[n] * 1e6:.0f} us" for n in sizes) if times
                       else ("" for _ in sizes)),
                     f"{fit['latency_s'] * 1e6:.1f} us", _rate(fit["bytes_per_s"]),
                     f"{fit['worst_error']:.0%}"])
    if site.intra_node_latency_s or site.intra_node_bytes_per_s:
        rows.append([f"{site.name} profile", *("" for _ in sizes),
                     "-" if site.intra_node_latency_s is None
                     else f"{site.intra_node_latency_s * 1e6:.1f} us",
                     "-" if site.intra_node_bytes_per_s is None
                     else _rate(site.intra_node_bytes_per_s), ""])
    else:
        rows.append([f"{site.name} profile", *("" for _ in sizes), "-", "-",
                     "(no intra-node link numbers)"])
    widths = [max(len(r[k]) for r in [heads, *rows]) for k in range(len(heads))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [heads, *rows])


def _size(nbytes: int) -> str:
    return f"{nbytes // 2 ** 20} MiB" if nbytes >= 2 ** 20 else f"{nbytes // 2 ** 10} KiB"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.2f} GB/s"
