"""Shared helpers: run the real `ddl` command in a subprocess, and a synthetic MNIST copy."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cli_fork
from shared_data import written_once

# Opt-in CPU accounting per test (DDL_TEST_CPU_REPORT=FILE), see tests/cpu_report.py.
pytest_plugins = ["cpu_report"]

REPO = Path(__file__).resolve().parents[1]
DDL = str(Path(sys.executable).with_name("ddl"))  # the console script of this venv


def live_workers(run_dir: Path) -> dict[int, int]:
    """{rank: pid} of a local run's workers still running: each rank's live state
    (RUN_DIR/live/rank-N.json) names its pid, and a forked worker is named ``ddl.worker``
    (``/proc/PID/comm``), so a pid reused since by another process is not taken. The
    workers' command lines are their fork server's and say nothing of the run."""
    found: dict[int, int] = {}
    for path in sorted((run_dir / "live").glob("rank-*.json")):
        try:
            doc = json.loads(path.read_text())
            if Path(f"/proc/{doc['pid']}/comm").read_text().strip() == "ddl.worker":
                found[int(doc["rank"])] = int(doc["pid"])
        except (OSError, ValueError, KeyError):
            continue
    return found


def run_ddl(*args: str, cwd: Path | None = None, env: dict | None = None,
            timeout: float = 600, fresh: bool = False) -> subprocess.CompletedProcess:
    """`ddl ARGS`, forked from the fork server that has ddl and torch imported
    (tests/cli_fork.py says what that keeps and when it falls back), or with ``fresh`` (or
    DDL_TEST_CLI=exec) the console script in a new interpreter."""
    # One intra-op thread, as every worker of a multi-process run has (ddl.launch.local): a
    # single-process reference on 2 threads splits oneDNN's convolution reductions
    # differently, and the tiny ResNet (plain BatchNorm) grows that rounding from 6e-8 to
    # 8e-3 in three SGD steps (measured on an AMD EPYC host), failing 1e-5 comparisons for a
    # reason that is not ddl's. (The pytest process itself keeps torch's default.)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return run_ddl_as(list(args), env=full_env, cwd=cwd, timeout=timeout, fresh=fresh)


def run_ddl_as(args: list[str], *, env: dict[str, str], cwd: Path | None = None,
               timeout: float = 600, fresh: bool = False) -> subprocess.CompletedProcess:
    """`ddl ARGS` in exactly the environment ``env``, as run_ddl runs it."""
    if not fresh and cli_fork.enabled():
        try:
            done = cli_fork.run(DDL, list(args), cwd=cwd, env=env, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            _fail_timed_out([DDL, *args], timeout, cwd, exc.output, exc.stderr)
        if done is not None:
            _log_cli("fork", args)
            return done
    _log_cli("exec" if fresh or not cli_fork.enabled() else
             f"exec({cli_fork.fallbacks[-1] if cli_fork.fallbacks else '?'})", args)
    return run_bounded([DDL, *args], cwd=cwd, env=env, timeout=timeout)


def run_bounded(cmd: list[str], *, timeout: float, cwd: Path | None = None,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) in a process group of its own. Past
    `timeout`, or when the test is ended (pytest-timeout), the whole group is killed (a
    launcher's workers too, not only the launcher); a timeout fails the test with the
    command and the tail of what it printed."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:  # what it printed before the kill (pipes a detached grandchild holds stay open)
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "<not readable>", "<not readable>"
        _fail_timed_out(cmd, timeout, cwd, out, err)
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _log_cli(way: str, args) -> None:
    if os.environ.get("DDL_TEST_CLI_LOG"):
        with open(os.environ["DDL_TEST_CLI_LOG"], "a") as log:
            log.write(f"{way} {os.environ.get('PYTEST_CURRENT_TEST', '')} {' '.join(args)[:80]}\n")


def _fail_timed_out(cmd: list[str], timeout: float, cwd: Path | None, out: str | None,
                    err: str | None) -> None:
    pytest.fail(f"timed out after {timeout:g} s, killed: {shlex.join(map(str, cmd))}"
                f"\n(cwd {cwd or os.getcwd()})\n--- last stdout:\n{_tail(out)}"
                f"\n--- last stderr:\n{_tail(err)}", pytrace=False)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def end_session(proc: subprocess.Popen, workers: list[int] = ()) -> None:
    """After a test: kill what is left of a command started with start_new_session=True,
    then reap it. Only by numbers that are still the command's: its pid (the session's id)
    while it is unreaped, and a worker while it is in that session. A reaped pid is free
    for reuse, and this suite goes round pid_max (32768, threads included) within minutes;
    kill() of a reused thread id ends that thread's whole process (a rank pool's, seen)."""
    if proc.returncode is None:
        cli_fork.kill_session(proc.pid)
    for pid in workers:
        if cli_fork.session_of(pid) == proc.pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.communicate()


def _tail(text: str | None, lines: int = 40) -> str:
    return "\n".join((text or "").splitlines()[-lines:]) or "<nothing>"


def install_plugin(site: Path, module: str, body: str, entry: str | None = None) -> dict:
    """A plugin installed as a third party ships one, as importlib.metadata sees it: a
    dist-info directory with a `ddl` entry point, beside its module, in ``site``. Returns
    the environment that puts ``site`` on the path of the `ddl` commands a test runs."""
    dist = module.replace("_", "-")
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[ddl]\n{entry or module} = {module}\n")
    (site / f"{module}.py").write_text(body)
    return {"PYTHONPATH": str(site)}


def gpt_example_workload(preset: str = "tiny"):
    """The example GPT plugin's workload (docs/examples/ddl-gpt-plugin), imported from its
    source as a third party's would be, without installing it."""
    source = str(REPO / "docs" / "examples" / "ddl-gpt-plugin" / "src")
    sys.path.insert(0, source)
    try:
        from ddl_gpt.plugin import PRESETS
        from ddl_gpt.workload import GptWorkload
    finally:
        sys.path.remove(source)
    return GptWorkload(PRESETS[preset])


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Bad input: exit 2, exactly one line on stderr naming the problem, no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="session")
def synthetic_mnist(tmp_path_factory) -> Path:
    """One synthetic MNIST for the whole run (generated by the project, not downloaded;
    written once for all workers: tests/shared_data.py)."""
    from ddl_mnist import synthetic

    return written_once(tmp_path_factory, "mnist", lambda root: synthetic.write_synthetic(
        root, train_size=3000, test_size=600, seed=0))


@pytest.fixture
def mnist_copy(synthetic_mnist, tmp_path) -> Path:
    """A private copy a test may damage."""
    target = tmp_path / "data"
    shutil.copytree(synthetic_mnist, target)
    return target


# The shared XSum's splits: `ddl prepare --synthetic`'s 1500 training articles (the same
# articles and tokenizer) but 48 validation and 48 test articles, not 300 each. Its tests
# compare layouts with each other on 3 steps, and evaluating 600 articles was ~12 s of the
# 3-D run's 30 on 8 ranks (2026-11-27). 48 divides among 1, 2, 3, 4, 6 and 8 replicas.
SHARED_XSUM_SIZES = {"train": 1500, "validation": 48, "test": 48}


@pytest.fixture(scope="session")
def synthetic_xsum(tmp_path_factory) -> Path:
    """XSum written once per session as `ddl prepare --plugin xsum --synthetic` writes it
    (synthetic articles, a tokenizer trained on them, t5-tiny's config), with the splits
    above; for tests that only read it. (The command itself: test_xsum_train.py and the
    tutorial's blocks.)"""
    from ddl_xsum import synthetic

    def write(root: Path) -> None:
        saved = dict(os.environ)  # it sets HF_* offline variables: not for this worker's runs
        try:
            synthetic.write_synthetic(root, sizes=SHARED_XSUM_SIZES)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return written_once(tmp_path_factory, "xsum", write)


@pytest.fixture(scope="session")
def synthetic_cifar(tmp_path_factory) -> Path:
    """CIFAR-10 as `ddl prepare --plugin cifar --synthetic` writes it, for tests that only
    read it (the command itself: test_cifar_train.py)."""
    from ddl_cifar import synthetic

    return written_once(tmp_path_factory, "cifar", synthetic.write_synthetic)


@pytest.fixture(scope="session")
def synthetic_imagewoof(tmp_path_factory) -> Path:
    """Imagewoof as `ddl prepare --plugin imagewoof --synthetic` writes it (~5 CPU s of
    JPEG encoding), for tests that only read it (the command: test_imagewoof_train.py)."""
    from ddl_imagewoof import synthetic

    return written_once(tmp_path_factory, "imagewoof", synthetic.write_synthetic)


def assert_same_weights(got: dict, want: dict, *, adam: bool = False,
                        noise: dict | None = None) -> None:
    """Parameters equal to 1e-5 relative, as the equivalence tests ask: the conformance
    kit's rules (ddl.conformance.tolerance, one definition for ddl's tests and plugin
    authors' kit runs): element by element for SGD-trained models (mnist, cifar), per
    tensor for AdamW-trained ones (imagewoof, xsum), where Adam turns reduction-order
    rounding on ~0 gradients into visible element differences (the module says what was
    measured)."""
    from ddl.conformance import assert_same_weights as kit_rule

    kit_rule(got, want, adam=adam, noise=noise)  # one definition: the conformance kit's (ddl.conformance)


@pytest.fixture(scope="session")
def rank_pools():
    """Persistent rank pools by world size (tests/rankpool.py): ``rank_pools[4].run(cell,
    *args)``. Started on first use, stopped at the end of the session."""
    from rankpool import pools

    yield pools()
    pools().close_all()


def _restoring_environment():
    """os.environ as it was before, once the test (or module) is done. ddl code run in this
    process sets variables for itself (the XSum plugin's HF_*, TRANSFORMERS_VERBOSITY);
    left behind, they would make every later `ddl` command of this worker differ from the
    fork server's environment and start a fresh interpreter instead (tests/cli_fork.py)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


# Module scope too: a module's fixtures (synthetic XSum written in this process) run before
# the per-test one takes its copy.
_module_environment_restored = pytest.fixture(scope="module", autouse=True)(
    _restoring_environment)
_environment_restored = pytest.fixture(autouse=True)(_restoring_environment)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist worksteal` (./run-tests): worksteal that keeps costly modules on one worker
    (tests/worker_schedule.py)."""
    if config.getvalue("dist") != "worksteal":
        return None
    from worker_schedule import ModuleKeepingWorkStealing

    return ModuleKeepingWorkStealing(config, log)


#: gloo fits planted for `ddl plan --site local` and `ddl train --mesh auto` (issue 51): a
#: plan of this machine reads them from its per-machine cache (ddl.planning.cpu_calibration)
#: and would otherwise measure them (30-45 s) and write ~/.cache. Numbers of the order this
#: 2-core VM measured (docs/plan.md); tests of the model plant their own.
PLANTED_LINKS = {"all_reduce": {"latency_s": 7e-4, "bytes_per_s": 1.5e9},
                 "all_gather": {"latency_s": 1e-3, "bytes_per_s": 4e8},
                 "reduce_scatter": {"latency_s": 1e-3, "bytes_per_s": 4e8},
                 "p2p": {"latency_s": 1e-3, "bytes_per_s": 7e8}}


def plant_cpu_links(folder: Path, fits: dict | None = None, nprocs=range(2, 9)) -> Path:
    """A cache of this machine's links (and matmul rate) in ``folder``, for DDL_CACHE_DIR."""
    from ddl.planning import cpu_calibration

    saved = os.environ.get("DDL_CACHE_DIR")
    os.environ["DDL_CACHE_DIR"] = str(folder)
    try:
        for n in nprocs:
            cpu_calibration.store(f"links-{n}", {"fits": fits or PLANTED_LINKS, "seconds": {}})
        cpu_calibration.store("matmul", {"flops_1_thread": 5e10})
    finally:
        if saved is None:
            os.environ.pop("DDL_CACHE_DIR")
        else:
            os.environ["DDL_CACHE_DIR"] = saved
    return folder


@pytest.fixture(scope="session", autouse=True)
def _planted_cpu_links(tmp_path_factory):
    folder = plant_cpu_links(tmp_path_factory.mktemp("ddl-cache"))
    saved = os.environ.get("DDL_CACHE_DIR")
    os.environ["DDL_CACHE_DIR"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("DDL_CACHE_DIR", None)
    else:
        os.environ["DDL_CACHE_DIR"] = saved
