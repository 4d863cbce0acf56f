"""Where ddl runs: the Python and torch floors, the torch build against the site, the CPU
architecture, and (inside a container) which paths outlive the container."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import DDL, assert_one_line_error, run_ddl
from ddl.launch import container_inside
from ddl.launch import environment
from ddl.contract.errors import UsageError
from ddl.settings.sites import get_site

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, expected", [
    ("2.14.1+cu130", (2, 14, 1)), ("2.6.0a0+ecf3bae40a", (2, 6, 0)), ("3.10", (3, 10)),
    ("2.11.0.dev20260101", (2, 11, 0)), ("v2.5.1", (2, 5, 1))])
def test_version_tuple_reads_the_leading_numbers(text, expected):
    assert environment.version_tuple(text) == expected


@pytest.mark.parametrize("found", ["2.7.0", "2.7.0a0+ecf3bae40a", "2.11.0+cu130",
                                   "2.14.1+cu130", "3.0.0"])
def test_torch_at_or_above_the_floor_passes(found):
    environment.check_torch(found)


@pytest.mark.parametrize("found", ["2.6.0", "2.5.1", "2.1.2", "1.13.1+cu117",
                                   "2.6.0a0+abc"])
def test_torch_below_the_floor_is_one_line_naming_both_versions(found):
    with pytest.raises(UsageError) as info:
        environment.check_torch(found)
    message = str(info.value)
    assert f"torch {found} is too old" in message and "torch >= 2.7" in message
    assert "\n" not in message


def test_missing_torch_says_what_is_needed():
    with pytest.raises(UsageError, match=r"torch is not installed; ddl needs torch >= 2\.7"):
        environment.check_torch(None)


def test_python_floor():
    environment.check_python((3, 10, 0))
    environment.check_python((3, 13, 1))
    for old in [(3, 9, 18), (3, 7, 4)]:
        with pytest.raises(UsageError, match=rf"Python {old[0]}\.{old[1]}\.{old[2]} is too "
                                             r"old for ddl; it needs Python >= 3\.10"):
            environment.check_python(old)


def test_the_floor_is_declared_once_and_matches_pyproject():
    pyproject = Path(__file__).resolve().parents[2] / "packages" / "core" / "pyproject.toml"
    text = pyproject.read_text()
    assert 'requires-python = ">=3.10"' in text
    assert environment.PYTHON_FLOOR == (3, 10)


def test_installed_torch_is_read_without_importing_it():
    """version.py read as text agrees with what torch itself reports once imported."""
    build = environment.installed_torch()
    import torch

    assert build is not None and build.version == torch.__version__
    expected = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"
    assert build.kind == expected
    assert build.toolkit == (torch.version.hip or torch.version.cuda)


@pytest.mark.parametrize("kind, toolkit, accelerator, fits", [
    ("cuda", "13.0", "cuda", True), ("cuda", "13.0", "rocm", False),
    ("rocm", "6.2", "rocm", True), ("rocm", "6.2", "cuda", False),
    ("cpu", None, "cuda", False), ("cpu", None, "rocm", False),
    ("cpu", None, "cpu", True), ("cuda", "13.0", "cpu", True)])
def test_torch_build_against_the_site(kind, toolkit, accelerator, fits):
    build = environment.TorchBuild("2.11.0", kind, toolkit)
    problem = environment.build_mismatch(build, "some-site", accelerator)
    assert (problem is None) == fits
    if not fits:
        label = {"cuda": "CUDA", "rocm": "ROCm"}[accelerator]
        assert f"some-site's {label} GPUs" in problem and f"a {label} build" in problem


def test_cte_power_needs_ppc64le_and_says_where_torch_comes_from():
    problem = environment.arch_mismatch(get_site("cte-power"), "x86_64")
    assert "this machine is x86_64; cte-power nodes are ppc64le" in problem
    assert "torch >= 2.7 built for ppc64le + CUDA" in problem and "Open-CE" in problem
    assert environment.arch_mismatch(get_site("cte-power"), "ppc64le") is None
    assert environment.arch_mismatch(get_site("juwels-booster"), "x86_64") is None


def _stand_in_torch(tmp_path, version: str, *, cuda: str | None = None,
                    importable: bool = True) -> dict[str, str]:
    """A directory holding a `torch` package that only has torch/version.py (ddl reads the
    version from there without importing torch) and an env that puts it first on the path.
    Not importable: importing it exits, so a test shows ddl refused before importing."""
    fake = tmp_path / "old" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "" if importable else "raise SystemExit('imported the old torch')\n")
    (fake / "version.py").write_text(f"__version__ = {version!r}\ncuda = {cuda!r}\nhip = None\n")
    return {"PYTHONPATH": str(tmp_path / "old")}


def test_train_refuses_an_old_torch_before_importing_it(tmp_path):
    """`ddl train` checks the floor first, from torch/version.py, before anything imports
    torch. The old torch is a stand-in (a package whose version.py says 2.4.1 and whose
    import fails loudly): a real torch < 2.7 with its CUDA libraries is a ~3 GB download
    this test should not need."""
    env = _stand_in_torch(tmp_path, "2.4.1", cuda='12.1', importable=False)
    run_dir = tmp_path / "run"
    proc = run_ddl("train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "1",
                   "--run-dir", str(run_dir), env=env)
    assert_one_line_error(proc, "torch 2.4.1 is too old for ddl", "torch >= 2.7")
    assert not run_dir.exists()


def test_doctor_reports_the_floor_on_an_old_torch(tmp_path):
    env = _stand_in_torch(tmp_path, "2.5.1")
    proc = run_ddl("doctor", "--site", "local", env=env)
    assert proc.returncode == 1
    assert "FAIL torch: torch 2.5.1 is too old for ddl; it needs torch >= 2.7" in proc.stdout


# --- inside a container ------------------------------------------------------------------

# /proc/self/mountinfo as the real Apptainer 1.4 showed it (tests/system checks the live
# one), abridged, session paths shortened: `apptainer exec --containall IMG` and
# `apptainer exec IMG` from /work/x.
CONTAINALL = """\
221 185 0:44 / / rw,nodev,relatime unbindable - overlay overlay ro,lowerdir=/s/lower:/s/root
231 221 0:43 /dev /dev rw,nosuid,relatime master:56 - tmpfs tmpfs rw
232 231 0:48 / /dev/shm rw,nosuid,nodev,relatime - tmpfs tmpfs rw
240 221 254:0 /etc/hosts /etc/hosts ro,nosuid,nodev,relatime master:54 - ext4 /dev/vda rw
242 221 0:50 / /proc rw,nosuid,nodev,relatime - proc proc rw
244 221 0:43 /root /root rw,nosuid,nodev,relatime master:56 - tmpfs tmpfs rw
245 221 0:43 /tmp /tmp rw,nosuid,nodev,relatime master:56 - tmpfs tmpfs rw
246 221 0:43 /var/tmp /var/tmp rw,nosuid,nodev,relatime master:56 - tmpfs tmpfs rw
"""
DEFAULT = """\
220 184 0:43 / / rw,nodev,relatime unbindable - overlay overlay ro,lowerdir=/s/lower:/s/root
222 220 0:6 / /dev rw,nosuid,relatime master:30 - devtmpfs devtmpfs rw
223 222 0:23 / /dev/shm rw,relatime master:31 - tmpfs tmpfs rw
234 220 254:0 /home/u /root rw,nosuid,nodev,relatime master:29 - ext4 /dev/vda rw
235 220 254:0 /tmp /tmp rw,nosuid,nodev,relatime master:50 - ext4 /dev/vda rw
240 220 254:0 /work/x /work/x rw,nosuid,nodev,relatime master:51 - ext4 /dev/vda rw
241 220 0:60 / /p/scratch rw,relatime - lustre 10.0.0.1@o2ib:/scratch rw
242 241 0:61 / /p/scratch/my\\040project/tmp rw,relatime - tmpfs tmpfs rw
243 220 0:62 /builds/x /builds/x rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u
244 220 7:1 / /opt/ref rw,relatime - squashfs /dev/loop1 ro
"""
IN = container_inside.RunningContainer("apptainer", "/work/ddl.sif", "cpu")


@pytest.mark.parametrize("mountinfo, path, lost", [
    (CONTAINALL, "/root/runs/a", "memory filesystem (tmpfs at /root)"),
    (CONTAINALL, "/tmp/r", "memory filesystem (tmpfs at /tmp)"),
    (CONTAINALL, "/work/x/runs", "image's own filesystem (overlay at /)"),
    (DEFAULT, "/work/x/runs/a", None),
    (DEFAULT, "/work/x", None),
    (DEFAULT, "/work/xy/runs", "image's own filesystem (overlay at /)"),
    (DEFAULT, "/root/runs", None),
    (DEFAULT, "/tmp/r", None),
    (DEFAULT, "/dev/shm/r", "memory filesystem (tmpfs at /dev/shm)"),
    (DEFAULT, "/opt/ddl/runs", "image's own filesystem (overlay at /)"),
    (DEFAULT, "/p/scratch/my project/runs", None),
    (DEFAULT, "/builds/x/runs", None),  # a host that is itself a container: overlay, bound
    (DEFAULT, "/opt/ref/runs", "image's own filesystem (squashfs at /opt/ref)"),
    (DEFAULT, "/p/scratch/my project/tmp/runs", "memory filesystem (tmpfs at "
                                                "/p/scratch/my project/tmp)"),
])
def test_which_paths_outlive_the_container(mountinfo, path, lost):
    reason = container_inside.why_lost(Path(path), container_inside.parse_mountinfo(mountinfo))
    if lost is None:
        assert reason is None
    else:
        assert reason is not None and lost in reason


def test_a_later_mount_over_the_same_point_wins():
    text = DEFAULT + "250 235 0:70 / /tmp rw - tmpfs tmpfs rw\n"
    mount = container_inside.mount_of(Path("/tmp/r"), container_inside.parse_mountinfo(text))
    assert mount.fstype == "tmpfs"


def test_a_lost_run_dir_is_refused_in_one_line_naming_the_fix():
    with pytest.raises(UsageError) as info:
        container_inside.check_kept(Path("/root/runs/a"), "--run-dir", IN, CONTAINALL)
    message = str(info.value)
    assert message.startswith("--run-dir: /root/runs/a is on a memory filesystem")
    assert "lost when it exits" in message and "apptainer run -B HOST_DIR" in message
    container_inside.check_kept(Path("/work/x/runs"), "--run-dir", IN, DEFAULT)  # kept


def test_outside_a_container_nothing_is_refused():
    container_inside.check_kept(Path("/root/runs/a"), "--run-dir", None, CONTAINALL)


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"APPTAINER_CONTAINER": "/x/a.sif", "SINGULARITY_CONTAINER": "/x/a.sif"},
     container_inside.RunningContainer("apptainer", "/x/a.sif", None)),
    ({"SINGULARITY_CONTAINER": "/appl/l.sif", "DDL_CONTAINER_TARGET": "rocm"},
     container_inside.RunningContainer("singularity", "/appl/l.sif", "rocm")),
    ({"DDL_CONTAINER_TARGET": "cpu"}, None),  # the variable alone is not a container
])
def test_container_detection_from_the_runtimes_variables(env, expected):
    assert container_inside.detect(env) == expected


def test_missing_data_dir_inside_a_container_suggests_binding():
    text = container_inside.missing_dir(Path("/work/data"), "--data-dir", IN,
                                        "run `ddl prepare`")
    assert text == ("--data-dir: /work/data does not exist inside the container "
                    "(/work/ddl.sif); if it exists on the host, bind it (apptainer run -B "
                    "/work/data ...), otherwise run `ddl prepare`")


def test_doctor_inside_a_container_is_not_a_missing_runtime(tmp_path):
    """The runtime's variables as Apptainer sets them inside (the real image is checked in
    tests/system/test_container_runtime.py); no apptainer on PATH there is expected."""
    env = {"APPTAINER_CONTAINER": "/work/ddl.sif", "DDL_CONTAINER_TARGET": "cpu",
           "PATH": str(Path(DDL).parent) + ":/usr/bin:/bin"}
    proc = run_ddl("doctor", "--site", "local", env=env)
    assert "ok   container: inside a container (/work/ddl.sif, target cpu)" in proc.stdout
    proc = run_ddl("doctor", "--site", "lumi-g", env=env)
    assert proc.returncode == 1
    assert ("FAIL container: inside a container (/work/ddl.sif, target cpu): a cpu image "
            "cannot use lumi-g's ROCm GPUs") in proc.stdout



def test_pp_needs_torch_2_10():
    environment.check_strategy_torch("pp", "2.10.0")
    environment.check_strategy_torch("pp", "2.14.1+cu130")
    environment.check_strategy_torch("fsdp", "2.7.1")  # the floor is enough for the others
    for old in ("2.7.1+cu126", "2.9.1"):
        with pytest.raises(UsageError) as info:
            environment.check_strategy_torch("pp", old)
        assert str(info.value) == ("--strategy pp: needs torch >= 2.10 (torch.distributed."
                                   f"pipelining as ddl drives it), found torch {old}; the "
                                   "other strategies run on torch >= 2.7")


def test_train_refuses_pp_on_torch_2_9_before_training(tmp_path):
    """As above, a stand-in torch 2.9.1 (passes the floor, not pp's): refused before torch
    is imported or anything written."""
    env = _stand_in_torch(tmp_path, "2.9.1", importable=False)
    run_dir = tmp_path / "run"
    proc = run_ddl("train", "--plugin", "mnist", "--preset", "tiny", "--strategy", "pp",
                   "--nproc", "2", "--run-dir", str(run_dir),
                   env=env)
    assert_one_line_error(proc, "--strategy pp: needs torch >= 2.10", "found torch 2.9.1")
    assert not run_dir.exists()


def test_doctor_names_strategies_a_torch_is_too_old_for(tmp_path):
    env = _stand_in_torch(tmp_path, "2.8.0")
    proc = run_ddl("doctor", "--site", "local", env=env)
    assert ("ok   torch: torch 2.8.0 (CPU-only build), ddl needs >= 2.7; too old for "
            "--strategy pp") in proc.stdout
