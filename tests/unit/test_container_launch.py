"""`ddl submit --container`: the launch line in the site's idiom, checked against
shared/facts/sites.md — JSC runs Apptainer with `--nv`; LUMI runs `singularity` (the
command that exists there) with `--rocm` and LUMI's bind paths.

Each script is compared with a reviewed golden file, the facts are asserted line by line,
and the script is executed by bash with stand-ins for the Slurm commands (no cluster
here) to see the exact words srun receives.
"""

import os
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from sbatch_harness import render, run_script

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).with_name("golden")
RUN = ["--plugin", "mnist", "--data-dir", "/scratch/proj/data"]
JSC_IMAGE = "/p/project1/proj/ddl-cuda.sif"
LUMI_IMAGE = "/project/project_465000000/ddl-rocm.sif"
# [S] LUMI docs: bind the file systems and the Slingshot libraries the RCCL plugin needs
LUMI_BINDS = ("/pfs,/scratch,/projappl,/project,/flash,/appl,/usr/lib64/libjansson.so.4,"
              "/usr/lib64/libcxi.so.1,/opt/cray,/var/spool/slurmd")
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
    assert launch[0].endswith(f" apptainer run --nv {JSC_IMAGE} \\")
    assert launch[1].lstrip().startswith("train --site=" + site + " --launcher=torchrun_jsc "
                                         "--nproc=4 ")


def test_lumi_runs_singularity_with_rocm_and_lumi_binds(capsys):
    script = render(capsys, "--site", "lumi-g", "--nodes", "2", "--container", LUMI_IMAGE, *RUN)
    launch = _launch(script)
    # srun style, 8 tasks per node bound to the GCDs' cores [LUMI AI guide]; `singularity`
    # (apptainer may not exist on LUMI), --rocm, and LUMI's bind list
    assert launch[0].startswith(f"srun --ntasks-per-node=8 --cpu-bind={LUMI_MASKS} ")
    assert launch[0].endswith(f" singularity run --rocm -B {LUMI_BINDS} {LUMI_IMAGE} \\")
    assert launch[1].lstrip().startswith("train --site=lumi-g --launcher=srun --nproc=8 ")
    # the module that sets LUMI's container bind paths is loaded first [newer LUMI guide]
    assert "module load lumi-aif-singularity-bindings" in script.splitlines()


def test_srun_receives_the_container_words_intact(capsys, tmp_path):
    image = "/project/my project/ddl $(rocm).sif"  # quoted, never expanded by the job
    script = render(capsys, "--site", "lumi-g", "--nodes", "2", "--container", image, *RUN)
    proc, args = run_script(script, tmp_path, nodes=["nid001", "nid002"],
                            hosts={"nid001": "10.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    at = args.index("singularity")
    assert args[at:at + 6] == ["singularity", "run", "--rocm", "-B", LUMI_BINDS, image]
    assert args[at + 6:at + 8] == ["train", "--site=lumi-g"]


def test_cpu_site_gets_no_gpu_flag_and_no_binds(capsys):
    launch = _launch(render(capsys, "--site", "local-slurm", "--container", "/tmp/ddl.sif", *RUN))
    assert " apptainer run /tmp/ddl.sif \\" in launch[0]


def test_flag_alone_uses_the_site_image(capsys, tmp_path, monkeypatch):
    profile = (REPO / "sites" / "lumi-g.toml").read_text()
    profile = profile.replace('name = "lumi-g"', 'name = "lumi-img"').replace(
        'runtime = "singularity"', 'runtime = "singularity"\nimage = "/appl/ddl/ddl-rocm.sif"')
    (tmp_path / "lumi-img.toml").write_text(profile)
    monkeypatch.setenv("DDL_SITE_PATH", str(tmp_path))
    launch = _launch(render(capsys, "--site", "lumi-img", "--container", *RUN))
    assert launch[0].endswith(f"-B {LUMI_BINDS} /appl/ddl/ddl-rocm.sif \\")


def test_flag_alone_without_a_site_image_is_one_line():
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--dry-run",
                   "--container")
    assert_one_line_error(proc, "--container: site jureca-dc has no default image",
                          "give --container IMAGE")


def test_missing_image_is_refused_when_submitting(tmp_path):
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--container",
                   str(tmp_path / "nope.sif"))
    assert_one_line_error(proc, f"--container: {tmp_path / 'nope.sif'} does not exist")


def test_local_image_goes_in_as_an_absolute_path(tmp_path):
    (tmp_path / "ddl.sif").write_bytes(b"")
    proc = run_ddl("submit", "--site", "jureca-dc", "--account", "proj", "--dry-run",
                   "--container", "ddl.sif", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"apptainer run --nv {tmp_path / 'ddl.sif'} \\" in proc.stdout
