"""`ddl container build`: the command it gives the real runtime (printed by --dry-run), how it
finds `apptainer` or else `singularity`, and its refusals. The real build runs in
tests/system/test_container.py.

Runtimes "on PATH" here are stand-in scripts in a temporary directory that answer
`--version` as the real ones do (Apptainer's string is the real 1.4.5's here; SingularityCE's,
"singularity-ce version 4.1.1", is a recorded fact, not run here): only that and their
presence are looked at, no build runs in these tests. The real Apptainer's answer is
checked in test_real_apptainer_is_recognised.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from test_no_torch import PROBE

pytestmark = pytest.mark.unit


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    for name in ("ddl-0.1.0-py3-none-any.whl", "ddl_mnist-0.1.0-py3-none-any.whl"):
        (wh / name).write_bytes(b"")
    return wh


VERSIONS = {"apptainer": "apptainer version 1.4.5",
            "singularity": "singularity-ce version 4.1.1-jammy",  # LUMI's kind (SingularityCE)
            "proot": "proot 5.4.0"}


def _path_with(tmp_path, *names, versions=VERSIONS) -> dict[str, str]:
    """PATH holding only stand-ins for the given programs (and nothing else to find)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\necho '{versions.get(name, '')}'\n")
        exe.chmod(0o755)
    return {"PATH": str(bin_dir)}


def _dry_run(tmp_path, wheelhouse, *args, env=None) -> list[str]:
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"), *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout.strip().splitlines()[-1])


def _build_args(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, w in enumerate(cmd) if w == "--build-arg")


def test_local_base_becomes_localimage(tmp_path, wheelhouse):
    base = tmp_path / "debian-root"
    base.mkdir()
    cmd = _dry_run(tmp_path, wheelhouse, "--base", str(base), "--no-compress", "--offline",
                   env=_path_with(tmp_path, "apptainer"))
    assert cmd[:2] == [str(tmp_path / "bin" / "apptainer"), "build"]
    assert cmd[cmd.index("--mksquashfs-args") + 1] == "-noI -noD -noF -noX"
    args = _build_args(cmd)
    assert args["BOOTSTRAP"] == "localimage" and args["FROM"] == str(base)
    assert args["WHEELHOUSE"] == str(wheelhouse)
    assert args["PIP_OPTIONS"] == "--no-index"  # --offline: the wheelhouse only
    assert args["DDL_COMMIT"] and args["BUILD_DATE"].endswith("Z")
    assert cmd[-2:] == [str(tmp_path / "out.sif"), str(REPO / "containers" / "cpu.def")]


def test_registry_base_and_user_build_args(tmp_path, wheelhouse):
    cmd = _dry_run(tmp_path, wheelhouse, "--target", "cuda",
                   "--base", "docker://nvcr.io/nvidia/pytorch:24.01-py3",
                   "--build-arg", "PIP_OPTIONS=--index-url https://pypi.example/simple")
    args = _build_args(cmd)
    assert (args["BOOTSTRAP"], args["FROM"]) == ("docker", "nvcr.io/nvidia/pytorch:24.01-py3")
    assert args["PIP_OPTIONS"] == "--index-url https://pypi.example/simple"
    assert cmd[-1].endswith("containers/cuda.def")
    assert "--mksquashfs-args" not in cmd


def test_without_base_the_definition_default_stays(tmp_path, wheelhouse):
    args = _build_args(_dry_run(tmp_path, wheelhouse))
    assert "BOOTSTRAP" not in args and "FROM" not in args  # docker python image (cpu.def)
    assert "PIP_OPTIONS" not in args  # the definition's: PyTorch's CPU index


def test_singularity_is_used_when_apptainer_is_missing(tmp_path, wheelhouse):
    cmd = _dry_run(tmp_path, wheelhouse, env=_path_with(tmp_path, "singularity", "proot"))
    assert cmd[0] == str(tmp_path / "bin" / "singularity")


def test_apptainer_is_preferred_unless_singularity_is_asked_for(tmp_path, wheelhouse):
    env = _path_with(tmp_path, "apptainer", "singularity", "proot")
    assert Path(_dry_run(tmp_path, wheelhouse, env=env)[0]).name == "apptainer"
    cmd = _dry_run(tmp_path, wheelhouse, "--runtime", "singularity", env=env)
    assert Path(cmd[0]).name == "singularity"


def test_neither_runtime_says_so(tmp_path, wheelhouse):
    proc = run_ddl("container", "build", "--wheelhouse", str(wheelhouse), "--output",
                   str(tmp_path / "out.sif"), env=_path_with(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert lines == ["ddl: error: neither apptainer nor singularity is on PATH: install "
                     "Apptainer (apptainer.org) or load the site's module; `ddl container "
                     "check` works without either"]


@pytest.mark.parametrize("args, needles", [
    (["--base", "/no/such/root"], ["--base: /no/such/root does not exist", "docker://REF"]),
    (["--base", "http://x/y"], ["--base: 'http://x/y' has an unknown scheme"]),
    (["--def", "/no/such.def"], ["--def: /no/such.def is not a file"]),
    (["--target", "gpu"], ["invalid choice: 'gpu'"]),
    (["--build-arg", "NOEQUALS"], ["'NOEQUALS' is not KEY=VALUE"]),
])
def test_bad_input_is_one_line(tmp_path, wheelhouse, args, needles):
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"), *args)
    assert_one_line_error(proc, *needles)


def test_existing_image_is_not_replaced_without_force(tmp_path, wheelhouse):
    (tmp_path / "out.sif").write_bytes(b"an image")
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"))
    assert_one_line_error(proc, "out.sif exists; pass --force")
    cmd = _dry_run(tmp_path, wheelhouse, "--force")
    assert "--force" in cmd
    assert (tmp_path / "out.sif").read_bytes() == b"an image"


def test_empty_wheelhouse_names_the_script(tmp_path):
    empty = tmp_path / "wh"
    empty.mkdir()
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(empty),
                   "--output", str(tmp_path / "out.sif"))
    assert_one_line_error(proc, f"--wheelhouse: no ddl wheel in {empty}",
                          f"scripts/build-wheelhouse.sh {empty}")


def test_broken_definition_stops_before_the_build(tmp_path, wheelhouse):
    broken = tmp_path / "broken.def"
    broken.write_text("Bootstrap: docker\nFrom: debian:12\n%psot\n    true\n")
    proc = run_ddl("container", "build", "--dry-run", "--def", str(broken), "--wheelhouse",
                   str(wheelhouse), "--output", str(tmp_path / "out.sif"))
    assert_one_line_error(proc, f"{broken}:3: unknown section %psot")
    # --no-check hands it to the runtime unread (its own parser reports it; system test)
    cmd = _dry_run(tmp_path, wheelhouse, "--def", str(broken), "--no-check")
    assert cmd[-1] == str(broken)


@pytest.mark.parametrize("args", [
    ["container", "--help"], ["container", "check", "--target", "cuda", "--base", "/"],
    ["container", "build", "--dry-run", "--base", "/", "--output", "/tmp/ddl-probe.sif"],
])
def test_container_commands_do_not_import_torch(args, wheelhouse):
    args = args + (["--wheelhouse", str(wheelhouse)] if len(args) > 2 else [])
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("HEAVY:"), proc.stdout


def test_default_output_is_containers_ddl_sif_of_the_checkout(tmp_path, wheelhouse):
    """The headline command runs `containers/ddl.sif`: that is where a build lands by
    default (from any working directory), and git ignores it."""
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   cwd=tmp_path, env=_path_with(tmp_path, "apptainer"))
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert cmd[-2] == str(REPO / "containers" / "ddl.sif")
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index",
                              "containers/ddl.sif", "containers/ddl-cuda.sif",
                              "wheelhouse/torch-2.14.1-x.whl"], capture_output=True, text=True)
    assert ignored.stdout.split() == ["containers/ddl.sif", "containers/ddl-cuda.sif",
                                      "wheelhouse/torch-2.14.1-x.whl"], ignored


@pytest.mark.parametrize("text, flavour, version", [
    ("apptainer version 1.4.5\n", "apptainer", (1, 4, 5)),
    ("singularity-ce version 4.1.1-jammy\n", "singularity-ce", (4, 1, 1)),
    ("singularity version 3.8.7-1.el8\n", "singularity", (3, 8, 7)),
])
def test_runtime_is_told_by_its_version_string(text, flavour, version):
    from ddl.launch.container_build import parse_version

    runtime = parse_version("/x/singularity", text)
    assert (runtime.flavour, runtime.version) == (flavour, version)
    assert runtime.has_mksquashfs_args == (flavour == "apptainer")
    assert runtime.has_build_args == (flavour != "singularity")


def test_an_unknown_version_string_is_an_error():
    from ddl.launch.container_build import parse_version
    from ddl.contract.errors import DdlError

    with pytest.raises(DdlError, match="expected 'apptainer version X'"):
        parse_version("/x/apptainer", "podman version 5.0.0")


def test_singularity_ce_gets_no_apptainer_only_options(tmp_path, wheelhouse):
    """SingularityCE (LUMI): the build arguments go through (4.x has them), squashfs
    options do not exist there and are refused rather than passed."""
    env = _path_with(tmp_path, "singularity", "proot")
    cmd = _dry_run(tmp_path, wheelhouse, env=env)
    assert Path(cmd[0]).name == "singularity" and "--mksquashfs-args" not in cmd
    assert "WHEELHOUSE" in _build_args(cmd)
    proc = run_ddl("container", "build", "--dry-run", "--no-compress", "--wheelhouse",
                   str(wheelhouse), "--output", str(tmp_path / "out.sif"), env=env)
    assert_one_line_error(proc, "--no-compress: singularity-ce 4.1.1 has no --mksquashfs-args")


def test_apptainer_gets_squashfs_options_and_fakeroot(tmp_path, wheelhouse):
    cmd = _dry_run(tmp_path, wheelhouse, "--no-compress", "--fakeroot",
                   env=_path_with(tmp_path, "apptainer"))
    assert cmd[cmd.index("--mksquashfs-args") + 1] == "-noI -noD -noF -noX"
    assert "--fakeroot" in cmd


def test_old_singularity_ce_cannot_take_build_arguments(tmp_path, wheelhouse):
    env = _path_with(tmp_path, "singularity", "proot",
                     versions={**VERSIONS, "singularity": "singularity-ce version 3.11.4"})
    proc = run_ddl("container", "build", "--dry-run", "--wheelhouse", str(wheelhouse),
                   "--output", str(tmp_path / "out.sif"), env=env)
    assert_one_line_error(proc, "needs build arguments", "singularity-ce 3.11.4 cannot pass",
                          "SingularityCE >= 4.0")


@pytest.mark.parametrize("host, fakeroot, needles", [
    # LUMI: a normal user, no /etc/subuid range, proot from `module load systools`
    (dict(is_root=False, has_subuid=False, has_proot=True), True,
     ["--fakeroot: singularity-ce 4.1.1 can fake root only", "module load systools"]),
    (dict(is_root=False, has_subuid=False, has_proot=False), False,
     ["only through proot, and proot is not on PATH", "module load systools"]),
])
def test_singularity_ce_unprivileged_build_rules(tmp_path, host, fakeroot, needles):
    """The rules for a normal user (these tests may run as root, so the host is given)."""
    from ddl.launch.container_build import BuildRequest, Host, Runtime, runtime_options
    from ddl.contract.errors import UsageError

    req = BuildRequest(definition=tmp_path / "x.def", output=tmp_path / "x.sif",
                       wheelhouse=tmp_path, fakeroot=fakeroot)
    runtime = Runtime("/usr/bin/singularity", "singularity-ce", (4, 1, 1))
    with pytest.raises(UsageError) as error:
        runtime_options(req, runtime, Host(**host), {})
    for needle in needles:
        assert needle in str(error.value)
    # where it can: proot present and no --fakeroot -> a plain unprivileged build
    req.fakeroot = False
    assert runtime_options(req, runtime, Host(False, False, True), {"X": "1"}) == []


def test_failure_reason_names_the_section_and_the_cause(tmp_path):
    """As Apptainer 1.4 prints a failing %post (captured from a real build): the FATAL
    line says only "exit status 127"; the cause is the shell's line before it."""
    from ddl.launch.container_build import failure_reason

    definition = tmp_path / "x.def"
    definition.write_text("Bootstrap: localimage\nFrom: /base\n\n%post\n    set -eu\n"
                          "    echo starting\n    nosuchcommand --flag\n")
    output = ["INFO:    Starting build...", "INFO:    Running post scriptlet", "+ set -eu",
              "+ echo starting", "starting", "+ nosuchcommand --flag",
              "/.post.script: 3: nosuchcommand: not found",
              "FATAL:   While performing build: while running engine: while running %post "
              "section: exit status 127"]
    assert failure_reason(output, definition) == \
        f"in %post: {definition}:7: nosuchcommand: not found"
    conflict = ["INFO:    Running post scriptlet",
                "ERROR: Cannot install accelerate and torch==1.0 because these package "
                "versions have conflicting dependencies.", "", "The conflict is caused by:",
                "    The user requested (constraint) torch==1.0",
                "    accelerate 1.15.0 depends on torch>=2.0.0", "", "To fix this you could",
                "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/x",
                "FATAL:   While performing build: while running engine: while running %post "
                "section: exit status 1"]
    reason = failure_reason(conflict, definition)
    assert reason.startswith("in %post: Cannot install accelerate and torch==1.0")
    assert reason.endswith("The conflict: The user requested (constraint) torch==1.0; "
                           "accelerate 1.15.0 depends on torch>=2.0.0")


@pytest.mark.parametrize("agent, ref, registry", [
    ("docker", "python:3.11-slim-bookworm", ("registry-1.docker.io", 443)),
    ("docker", "nvcr.io/nvidia/pytorch:25.09-py3", ("nvcr.io", 443)),
    ("docker", "localhost:5000/ddl:1", ("localhost", 5000)),
    ("docker", "library/debian:12", ("registry-1.docker.io", 443)),
    ("localimage", "/appl/x.sif", None),
    ("oras", "ghcr.io/org/ddl:1", ("ghcr.io", 443)),
])
def test_the_registry_a_base_pulls_from(agent, ref, registry):
    from ddl.launch.container_offline import registry_of

    assert registry_of(agent, ref) == registry


def test_an_unreachable_registry_gives_the_offline_route_before_building(tmp_path,
                                                                           wheelhouse):
    """No network: the runtime would fail deep in its pull; ddl names the offline route in
    one line and starts no build. Port 9 of this machine refuses (nothing listens), which
    is what a registry without network looks like to the probe, on any machine."""
    env = _path_with(tmp_path, "apptainer")
    started = tmp_path / "build-started"
    (tmp_path / "bin" / "apptainer").write_text(
        f"#!/bin/sh\n[ \"$1\" = build ] && touch {started}\necho 'apptainer version 1.4.5'\n")
    proc = run_ddl("container", "build", "--target", "cpu", "--wheelhouse", str(wheelhouse),
                   "--base", "docker://127.0.0.1:9/python:3.11", "--output",
                   str(tmp_path / "out.sif"), env={**env, "HTTPS_PROXY": ""})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    for needle in ("the base docker://127.0.0.1:9/python:3.11 needs 127.0.0.1:9, which "
                   "cannot be reached", "scripts/build-wheelhouse.sh --cpu-torch --offline "
                   "wheelhouse", "ddl container build --offline", "--base BASE"):
        assert needle in lines[0], lines[0]
    assert not started.exists()


# --- the torch pair comes from the wheelhouse (issue 52, item 7) ------------------------------
def _wheels(where: Path, *names: str) -> Path:
    where.mkdir(exist_ok=True)
    for name in ("ddl-0.1.0-py3-none-any.whl", *names):
        (where / name).write_bytes(b"")
    return where


def test_the_cpu_build_installs_the_torch_pair_the_wheelhouse_holds(tmp_path):
    """README's offline route: build-wheelhouse.sh --cpu-torch found 2.13.0+cpu where
    cpu.def's default names 2.14.1; the build reads the pair from the wheels."""
    from ddl.launch import container_build as c

    wh = _wheels(tmp_path / "wh", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "torchrun_jsc-0.0.19-py3-none-any.whl")
    req = c.BuildRequest(definition=c.definition_for("cpu"), output=tmp_path / "x.sif",
                         wheelhouse=wh, offline=True)
    assert c.validate(req, check=False)["TORCH"] == "torch==2.13.0+cpu torchvision==0.28.0"
    req.build_args = {"TORCH": "torch==2.14.1 torchvision==0.29.1"}  # the user's wins
    assert c.validate(req, check=False)["TORCH"] == "torch==2.14.1 torchvision==0.29.1"
    req.build_args = {}
    req.definition = c.definition_for("cuda")  # takes torch from its base: no TORCH
    assert "TORCH" not in c.validate(req, check=False)


def test_without_torch_wheels_the_definition_default_stays(tmp_path):
    from ddl.launch import container_build as c

    req = c.BuildRequest(definition=c.definition_for("cpu"), output=tmp_path / "x.sif",
                         wheelhouse=_wheels(tmp_path / "wh"))
    assert "TORCH" not in c.validate(req, check=False)


def test_two_torch_versions_in_the_wheelhouse_are_refused_in_one_line(tmp_path):
    from ddl.contract.errors import UsageError
    from ddl.launch import container_build as c

    wh = _wheels(tmp_path / "wh", "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
                 "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "torchvision-0.29.1-cp311-cp311-manylinux_2_28_x86_64.whl")
    with pytest.raises(UsageError) as err:
        c.wheelhouse_torch(wh)
    assert "torch 2.13.0+cpu and 2.14.1" in str(err.value)
    assert "--build-arg TORCH=" in str(err.value) and "\n" not in str(err.value)


def test_the_empty_wheelhouse_hint_names_the_cpu_torch_flag(tmp_path):
    """Issue 52, item 9: the flag is --cpu-torch (--torch adds the CUDA build)."""
    from ddl.contract.errors import UsageError
    from ddl.launch import container_build as c

    (tmp_path / "wh").mkdir()
    with pytest.raises(UsageError) as err:
        c.check_wheelhouse(tmp_path / "wh")
    assert "add --cpu-torch for the CPU image" in str(err.value)
    assert "--torch " not in str(err.value)
