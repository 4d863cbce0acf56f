"""Fixtures shared by the system tests: a real Apptainer and ONE CPU image per test run.

The Apptainer is Debian sid's 1.4, provided on this Debian 12 machine by
../shared/tools/provide-apptainer (also the Debian 12 Python root used as the
`Bootstrap: localimage` base: registries are unreachable here). Both, and the offline
wheelhouse, are cached outside the checkout (tests/system/build_cache.py: ~/.cache/ddl,
keyed by the provider script and by requirements.lock), so a fresh clone on the same
machine reuses them. Every system test that asks for `image` shares the same build (it
takes minutes on 2 cores), made once per run for all pytest-xdist workers; the container
tests share one worker (the `container` xdist group), and the Slurm tests' worker waits
for the build when one of them runs the image.

Which torch: the image is the CPU image, so it gets a CPU build of torch. PyTorch's CPU
index (the definition's default) is unreachable here; the only CPU torch on this machine
is 2.13.0+cpu, and the only torchvision for it 0.28.0 (a CUDA build, whose compiled ops
cannot load beside it: containers/cpu.def handles that, docs/containers.md says how).
PyPI's CUDA build of 2.14.1 would put ~2 GB of CUDA libraries that torch loads at import
into a CPU image (docs/containers.md has the measurement).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DDL, REPO, run_bounded
from shared_data import written_once

from .build_cache import apt_turn, cache_root, entry, held, prune_other_wheelhouses

PROVIDE = Path(os.environ.get("DDL_PROVIDE_APPTAINER",
                              REPO.parent / "shared" / "tools" / "provide-apptainer"))
LOCK = REPO / "requirements.lock"
CACHE = cache_root()
APPTAINER_DIR = (entry(CACHE, "apptainer", PROVIDE) if PROVIDE.is_file()
                 else CACHE / "apptainer-unprovided")  # runtime_env says what is missing
BASE = APPTAINER_DIR / "base"
WHEELHOUSE = entry(CACHE, "wheelhouse", LOCK)
CPU_TORCH = ("torch==2.13.0+cpu", "torchvision==0.28.0")
# What PyPI's CUDA build of torch brings and a CPU image must not carry.
CUDA_WHEELS = ("torch-", "torchvision-", "nvidia_", "triton-", "cuda_")
# Tests that use these share this module's session fixtures (one Apptainer, one image).
BUILD_FIXTURES = {"runtime_env", "cpu_wheelhouse", "image"}
# Of those, the ones any worker may use: the image is built once per run for all workers
# (shared_data.written_once; the first to ask builds it, the others wait on its lock), and
# the provided Apptainer is a cache entry. So a Slurm test can run the image (test_slurm.py).
ANY_WORKER = {"runtime_env", "image"}
# The first of them may fill a cold cache: 361 s with the image build at load 5-6 (warm:
# 91 s; docs/testing.md); this allows 6x that.
COLD_CACHE_LIMIT_S = 2400
# Test files whose tests share a session fixture, and so one pytest-xdist worker: two
# workers would start the local Slurm twice, or build the image twice.
WORKER_GROUPS = {"test_slurm.py": "slurm", "test_container.py": "container",
                 "test_container_builds.py": "container",
                 "test_container_runtime.py": "container",
                 "test_container_submit.py": "container",
                 "test_browser.py": "browser",  # one Chromium install (the `chromium` fixture)
                 # one fresh venv with the example plugin installed (a module fixture): its
                 # tests handed out one by one built it on both workers
                 "test_example_plugin.py": "example-plugin",
                 "test_gpt_example_plugin.py": "gpt-plugin"}


def worker_group(nodeid: str) -> str | None:
    path = Path(nodeid.split("::", 1)[0])
    return WORKER_GROUPS.get(path.name) if path.parent.name == "system" else None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (.ci/run) with WORKER_GROUPS as the groups. pytest-xdist's own
    loadgroup cannot group under pytest 9: it renames each marked item's nodeid, which
    pytest 9 ignores (measured: the Slurm and the image fixtures came up on both workers).
    Ungrouped tests go to whichever worker is free, as with loadgroup."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid) or nodeid

    return SharedFixtureScheduling(config, log)


# The order the system tests are handed out in (`--dist loadgroup` deals whole groups in
# collection order, two to each worker first): the two long groups first, one to each
# worker, then the longest ungrouped files (times in CI at 5084f9b), so that no worker is
# given a 5-minute group when the other is nearly done. Within the Slurm group the
# time-limit requeue goes first: it waits on Slurm the longest (a signal 15-45 s in, then a
# requeue), and the others' jobs run beside it on the second node.
FIRST = ("slurm", "container", "gpt-plugin", "example-plugin", "test_check_plugin.py",
         "test_main_job.py", "test_bootstrap.py")
FIRST_IN_GROUP = ("test_time_limit_requeues",)


def _handing_out_order(item) -> tuple[int, int]:
    path = Path(item.nodeid.split("::", 1)[0])
    key = worker_group(item.nodeid) or path.name
    rank = FIRST.index(key) if key in FIRST else len(FIRST)
    return rank, 0 if item.name.startswith(FIRST_IN_GROUP) else 1


def pytest_collection_modifyitems(items):
    """Keep WORKER_GROUPS true: a test elsewhere that asks for the Slurm or the image
    fixtures is refused at collection. Tests that may fill a cold build cache get the time
    that needs (pyproject.toml's default is for everything else). Then hand the system
    tests out in FIRST's order (a stable sort: the same on every xdist worker)."""
    system = [item for item in items if item.path.is_relative_to(Path(__file__).parent)]
    if system and len(system) == len(items):
        items.sort(key=_handing_out_order)
    for item in items:
        if not item.path.is_relative_to(Path(__file__).parent):
            continue
        used, group = set(item.fixturenames), worker_group(item.nodeid)
        for fixtures, wanted in (({"slurm"}, "slurm"), (BUILD_FIXTURES - ANY_WORKER,
                                                         "container")):
            if fixtures & used and group != wanted:
                raise pytest.UsageError(f"{item.nodeid} uses {sorted(fixtures & used)}: add "
                                        f"its file to WORKER_GROUPS as {wanted!r} in "
                                        f"{Path(__file__).name}")
        if BUILD_FIXTURES & used and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(COLD_CACHE_LIMIT_S))


@pytest.fixture(scope="session")
def runtime_env() -> dict[str, str]:
    """The environment with a real apptainer first on PATH (provided once, then reused)."""
    if not PROVIDE.is_file():
        pytest.fail(f"{PROVIDE} not found: the system tests need ../shared/tools beside the "
                    "checkout (or DDL_PROVIDE_APPTAINER)")
    with held(APPTAINER_DIR), apt_turn():  # returns at once when another session made it
        proc = run_bounded([str(PROVIDE), str(APPTAINER_DIR)], timeout=1200)
    assert proc.returncode == 0, f"provide-apptainer failed:\n{proc.stdout}\n{proc.stderr}"
    env = {**os.environ, "PATH": f"{APPTAINER_DIR / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DDL_SITE_PATH", None)  # the image must find its own profiles
    return env


def first_in_line(cmd: list[str]) -> list[str]:
    """``cmd`` run ahead of the other tests' processes where this user may (root: CI).
    Every container test waits on the image build (wheelhouse, then `ddl container
    build`), which ran beside the Slurm tests' trainings on the other worker: 60 s alone,
    100-124 s beside them. The kernel shares the CPU between sessions first (autogroups,
    sched(7)), and run_bounded starts each command in a session of its own, so a process's
    own nice value does nothing against the trainings; the session's autogroup gets nice
    -10 instead. Elsewhere the write fails and the command runs as before."""
    return ["sh", "-c", 'echo -10 > /proc/self/autogroup 2>/dev/null; exec "$@"',
            "first-in-line", *cmd]


@pytest.fixture(scope="session")
def cpu_wheelhouse(tmp_path_factory) -> Path:
    """The CPU image's offline wheelhouse by the one command docs/containers.md gives,
    `scripts/build-wheelhouse.sh --cpu-torch --offline`, with this machine's CPU pair
    ($TORCH; $TORCH_INDEX empty: pip's local wheel stores, PyTorch's CPU index being
    unreachable): hard links into a directory of this session (several test sessions may
    build at once). The shared wheelhouse is this lock's cache entry; this clone's ddl
    wheels replace the previous ones there while it is held. GPU wheels an older cache
    entry may hold (PyPI's CUDA torch and its nvidia-* libraries) are left out."""
    wheelhouse = tmp_path_factory.mktemp("wheelhouse-cpu")
    cpu_pair = tuple(pin.replace("==", "-") + "-" for pin in CPU_TORCH)
    with held(WHEELHOUSE):
        wheels = run_bounded(first_in_line([str(REPO / "scripts" / "build-wheelhouse.sh"),
                                            "--cpu-torch", "--offline", str(WHEELHOUSE)]),
                             env={**os.environ, "TORCH": " ".join(CPU_TORCH),
                                  "TORCH_INDEX": ""}, timeout=1800)
        assert wheels.returncode == 0, wheels.stderr
        for path in WHEELHOUSE.iterdir():
            if path.is_file() and (path.name.startswith(cpu_pair)
                                   or not path.name.startswith(CUDA_WHEELS)):
                try:
                    os.link(path, wheelhouse / path.name)
                except OSError:  # another file system
                    shutil.copy2(path, wheelhouse / path.name)
    for stale in prune_other_wheelhouses(WHEELHOUSE):
        print(f"removed the wheelhouse of another lock: {stale}")
    return wheelhouse


@pytest.fixture(scope="session")
def image(runtime_env, request, tmp_path_factory) -> Path:
    """The CPU image, built through `ddl container build` as docs/containers.md says
    (wheelhouse by scripts/build-wheelhouse.sh --torch --offline: no package index), its
    `%test` left to `apptainer test` in test_container.py rather than run twice. Built
    once per run for every pytest-xdist worker (the Slurm tests' worker runs it too) and
    removed at the run's end (pytest_sessionfinish below): gigabytes."""

    def build(folder: Path) -> None:
        wheelhouse = request.getfixturevalue("cpu_wheelhouse")  # only where it is built
        sif = folder / IMAGE_FILE
        # run_bounded as run_ddl(fresh=True) would, ahead of the other tests (first_in_line)
        done = run_bounded(first_in_line([
            DDL, "container", "build", "--target", "cpu", "--base", str(BASE),
            "--wheelhouse", str(wheelhouse), "--offline", "--no-compress",
            "--no-test",  # the image's %test runs in test_apptainer_test_runs_the_smoke_check
            "--build-arg", "TORCH=" + " ".join(CPU_TORCH), "--output", str(sif)]),
            cwd=REPO, env={**runtime_env, "OMP_NUM_THREADS": "1"}, timeout=2400)
        assert done.returncode == 0, done.stderr[-5000:]
        assert f"ddl: built {sif}" in done.stdout

    return written_once(tmp_path_factory, IMAGE_DIR, build) / IMAGE_FILE


IMAGE_DIR, IMAGE_FILE = "image", "ddl-cpu.sif"


def pytest_sessionfinish(session):
    """The shared image goes once no test can use it any more: in pytest-xdist's controller
    after every worker ended (their run directory is its base directory), or in the one
    pytest process without xdist."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        shutil.rmtree(factory.getbasetemp() / f"shared-{IMAGE_DIR}", ignore_errors=True)


CHROMIUM_PACKAGES = ("chromium", "chromium-driver")  # Debian's; chromedriver is the driver's


@pytest.fixture(scope="session")
def chromium() -> dict[str, str]:
    """Paths of a headless-capable Chromium and its chromedriver (tests/system/webdriver.py).
    Installed once per session with apt-get when not on PATH (CI runs as root on a fresh
    machine; 26 packages, 121 MB, 43 s here on 2026-11-26); a failed install fails the
    test, naming the command and apt-get's error."""
    found = {name: shutil.which(name) for name in ("chromium", "chromedriver")}
    if all(found.values()):
        return found
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y",
           "--no-install-recommends", *CHROMIUM_PACKAGES]
    started = time.monotonic()
    with apt_turn():
        proc = _apt_get(apt)
        if proc.returncode != 0:  # no or stale package lists (a fresh container): update, retry
            update = _apt_get(["apt-get", "-o", "DPkg::Lock::Timeout=600", "update"])
            proc = update if update.returncode else _apt_get(apt)
    found = {name: shutil.which(name) for name in ("chromium", "chromedriver")}
    if proc.returncode != 0 or not all(found.values()):
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        last = [line for line in lines if line.startswith("E:")][-1:] or lines[-1:]
        pytest.fail(f"could not install {' '.join(CHROMIUM_PACKAGES)} for the browser tests "
                    f"(`{' '.join(apt)}` as uid {os.getuid()}: {last[0]})", pytrace=False)
    print(f"installed {' '.join(CHROMIUM_PACKAGES)} in {time.monotonic() - started:.0f} s")
    return found


def _apt_get(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return run_bounded(cmd, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                           timeout=900)
    except OSError as exc:  # no apt-get: not Debian
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))


def apptainer(env: dict[str, str], *args: str, cwd: Path | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """The real apptainer (from `runtime_env`), output captured."""
    return run_bounded(["apptainer", *args], env=env, cwd=cwd, timeout=timeout)
