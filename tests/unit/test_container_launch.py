"""`ddl submit --container`: the launch line in the site's idiom, checked against
shared/facts/sites.md — JSC runs Apptainer with `--nv`; LUMI runs `singularity` (the
command that exists there) with `--rocm`, its binds set by LUMI's bindings module.

Each script is compared with a reviewed golden file, the facts are asserted line by line,
and the script is executed by bash with stand-ins for the Slurm commands (no cluster
here) to see the exact words srun receives, including which directories get bound.
"""

import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from sbatch_harness import render, run_script

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).with_name("golden")
RUN = ["--plugin", "mnist", "--data-dir", "/scratch/proj/data"]
JSC_IMAGE = "/p/project1/proj/ddl-cuda.sif"
LUMI_IMAGE = "/project/project_465000000/ddl-rocm.sif"
LUMI_MASKS = ("mask_cpu:0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,"
              "0x00000000fe000000,0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,"
              "0x0000fe0000000000")
CASES = {"jureca-dc": JSC_IMAGE, "juwels-booster": JSC_IMAGE, "lumi-g": LUMI_IMAGE}


@pytest.mark.parametrize("site", sorted(CASES))
def test_matches_reviewed_golden_file(capsys, site):
    script = render(capsys, "--site", site, "--nodes", "2", "--container", CASES[site], *RUN)
    golden = GOLDEN / f"{site}-2n-container.sbatch"
    if os.environ.get("DDL_UPDATE_GOLDEN") == "1":
        golden.write_text(script)
    assert script == golden.read_text()


def _launch(script: str) -> list[str]:
    lines = script.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("srun ")]
    assert len(starts) == 1, script
    return lines[starts[0]:starts[0] + 2]


@pytest.mark.parametrize("site", ["jureca-dc", "juwels-booster"])
def test_jsc_runs_apptainer_with_nv(capsys, site):
    launch = _launch(render(capsys, "--site", site, "--nodes", "2", "--container", JSC_IMAGE,
                            *RUN))
    # one torchrun_jsc per node under srun --cpu_bind=none [JSC course], inside Apptainer
    # (JSC's container runtime) with NVIDIA's driver libraries (--nv)
    assert launch[0].startswith("srun --ntasks-per-node=1 --cpu-bind=none ")
    assert launch[0].endswith(f' apptainer run --nv "${{ddl_binds[@]}}" {JSC_IMAGE} \\')
    assert launch[1].lstrip().startswith("train --site=" + site + " --launcher=torchrun_jsc "
                                         "--nproc=4 ")


def test_lumi_runs_singularity_with_rocm_and_the_bindings_module(capsys):
    script = render(capsys, "--site", "lumi-g", "--nodes", "2", "--container", LUMI_IMAGE, *RUN)
    launch = _launch(script)
    # srun style, 8 tasks per node bound to the GCDs' cores [LUMI AI guide]; `singularity`
    # (apptainer may not exist on LUMI), --rocm
    assert launch[0].startswith(f"srun --ntasks-per-node=8 --cpu-bind={LUMI_MASKS} ")
    assert launch[0].endswith(f' singularity run --rocm "${{ddl_binds[@]}}" {LUMI_IMAGE} \\')
    assert launch[1].lstrip().startswith("train --site=lumi-g --launcher=srun --nproc=8 ")
    # the binds LUMI's containers need come from its module [LUMI AI guide], not from a
    # second, fixed list; ddl adds only the job's own directories
    lines = script.splitlines()
    assert "module load lumi-aif-singularity-bindings" in lines
    assert 'for path in "$run_dir" /scratch/proj/data; do' in lines
    assert not any("libjansson" in line for line in lines)


def _dirs(tmp_path):
    data, runs = tmp_path / "data", tmp_path / "runs"
    data.mkdir()
    runs.mkdir()
    return data, runs


def test_srun_receives_the_container_words_intact(capsys, tmp_path):
    data, runs = _dirs(tmp_path)
    image = "/project/my project/ddl $(rocm).sif"  # quoted, never expanded by the job
    script = render(capsys, "--site", "lumi-g", "--nodes", "2", "--container", image,
                    "--plugin", "mnist", "--data-dir", str(data), "--output-dir", str(runs))
    proc, args = run_script(script, tmp_path, nodes=["nid001", "nid002"],
                            hosts={"nid001": "10.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    at = args.index("singularity")
    run_dir = runs / "mnist-ddp-1234567"
    assert args[at:at + 8] == ["singularity", "run", "--rocm", "-B", str(run_dir), "-B",
                               str(data), image]
    assert args[at + 8:at + 10] == ["train", "--site=lumi-g"]
    assert run_dir.is_dir()  # created before the launch: a missing bind source is fatal


def _profile_with_binds(tmp_path, monkeypatch, binds):
    profile = (REPO / "sites" / "jureca-dc.toml").read_text()
    profile = profile.replace('name = "jureca-dc"', 'name = "bindy"').replace(
        'runtime = "apptainer"', f"runtime = \"apptainer\"\nbinds = {binds!r}".replace("'", '"'))
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "bindy.toml").write_text(profile)
    monkeypatch.setenv("DDL_SITE_PATH", str(sites))


def test_site_binds_missing_on_the_node_are_left_out(capsys, tmp_path, monkeypatch):
    data, runs = _dirs(tmp_path)
    lib = tmp_path / "libcxi.so.1"
    lib.write_bytes(b"")
    missing = tmp_path / "not-on-this-node"
    _profile_with_binds(tmp_path, monkeypatch, [str(lib), f"{missing}:/opt/x", str(tmp_path)])
    script = render(capsys, "--site", "bindy", "--nodes", "2", "--container", JSC_IMAGE,
                    "--plugin", "mnist", "--data-dir", str(data), "--output-dir", str(runs))
    proc, args = run_script(script, tmp_path, nodes=["jr1", "jr2"],
                            hosts={"jr1": "10.0.0.1", "jr1i": "10.1.0.1"})
    assert proc.returncode == 0, proc.stderr
    at = args.index("apptainer")
    # data and run dirs lie in tmp_path, a site bind: not bound twice
    assert args[at:at + 8] == ["apptainer", "run", "--nv", "-B", str(lib), "-B",
                               str(tmp_path), JSC_IMAGE]
    assert f"ddl: note: {missing} does not exist on " in proc.stderr


@pytest.mark.parametrize("flag, value", [("--data-dir", "/scratch/a,b"),
                                         ("--output-dir", "/scratch/x:y")])
def test_a_path_the_bind_syntax_cannot_carry_is_one_line(flag, value):
    proc = run_ddl("submit", "--site", "lumi-g", "--account", "proj", "--dry-run",
                   "--container", LUMI_IMAGE, flag, value)
    assert_one_line_error(proc, f"{flag}: {value}", "cannot be bound into a container",
                          "without ',' or ':'")


def test_cpu_site_gets_no_gpu_flag(capsys):
    launch = _launch(render(capsys, "--site", "local-slurm", "--container", "/tmp/ddl.sif", *RUN))
    assert ' apptainer run "${ddl_binds[@]}" /tmp/ddl.sif \\' in launch[0]


def test_flag_alone_uses_the_site_image(capsys, tmp_path, monkeypatch):
    profile = (REPO / "sites" / "lumi-g.toml").read_text()
    profile = profile.replace('name = "lumi-g"', 'name = "lumi-img"').replace(
        'runtime = "singularity"', 'runtime = "singularity"\nimage = "/appl/ddl/ddl-rocm.sif"')
    (tmp_path / "lumi-img.toml").write_text(profile)
    monkeypatch.setenv("DDL_SITE_PATH", str(tmp_path))
    launch = _launch(render(capsys, "--site", "lumi-img", "--container", *RUN))
    assert launch[0].endswith(' "${ddl_binds[@]}" /appl/ddl/ddl-rocm.sif \\')


def test_flag_alone_without_a_site_image_is_one_line():
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--dry-run",
                   "--container")
    assert_one_line_error(proc, "--container: site jureca-dc has no default image",
                          "give --container IMAGE")


@pytest.mark.parametrize("image", ["\r", " ddl.sif", "ddl\n.sif"])
def test_an_image_name_with_control_characters_is_one_line(image):
    """Found by the property test: `--container $'\\r'` printed a note split by the CR."""
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--dry-run",
                   "--container", image)
    assert_one_line_error(proc, f"--container: {image!r} has a control character",
                          "allowed: an image file's path")


def test_missing_image_is_refused_when_submitting(tmp_path):
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--container",
                   str(tmp_path / "nope.sif"))
    assert_one_line_error(proc, f"--container: {tmp_path / 'nope.sif'} does not exist")


def test_local_image_goes_in_as_an_absolute_path(tmp_path):
    (tmp_path / "ddl.sif").write_bytes(b"")
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--dry-run",
                   "--container", "ddl.sif", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f'apptainer run --nv "${{ddl_binds[@]}}" {tmp_path / "ddl.sif"} \\' in proc.stdout


# --- the image's target label against the site (with a real runtime: tests/system) -------

def test_target_not_checked_without_a_runtime_says_so_once(tmp_path):
    """No apptainer/singularity on PATH (as on a login node without the module): the
    script is still printed, with one note that the target was not checked."""
    (tmp_path / "ddl.sif").write_bytes(b"")
    bin_dir = tmp_path / "bin"  # bash (for the script's syntax check) and nothing else
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash"))
    env = {"PATH": str(bin_dir), "DDL_SITE_PATH": ""}
    proc = run_ddl("submit", "--site", "lumi-g", "--account", "proj", "--dry-run",
                   "--container", "ddl.sif", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "ddl: note: neither apptainer nor singularity is on PATH here: the image's target "
        "was not checked against site lumi-g"]


def test_target_of_a_registry_image_is_not_checked_and_says_so():
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--dry-run",
                   "--container", "docker://ghcr.io/x/ddl:cuda")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "ddl: note: docker://ghcr.io/x/ddl:cuda is not a local image file: the image's "
        "target was not checked against site jureca-dc"]
    assert "apptainer run --nv \"${ddl_binds[@]}\" docker://ghcr.io/x/ddl:cuda \\" in proc.stdout


def test_a_symlinked_data_dir_is_bound_and_passed_as_its_real_path(capsys, tmp_path):
    """LUMI's /scratch/<project> entries are symlinks into /pfs [facts: LUMI]: the bind and
    the --data-dir the job gets must name the same, real path."""
    real = tmp_path / "pfs" / "data"
    real.mkdir(parents=True)
    (tmp_path / "scratch").symlink_to(tmp_path / "pfs")
    script = render(capsys, "--site", "lumi-g", "--container", LUMI_IMAGE, "--plugin", "mnist",
                    "--data-dir", str(tmp_path / "scratch" / "data"))
    assert f'for path in "$run_dir" {real}; do' in script.splitlines()
    assert f"--data-dir={real}" in _launch(script)[1].split()
