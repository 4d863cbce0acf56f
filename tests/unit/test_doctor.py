"""`ddl doctor`: one line per check, non-zero exit when something a job needs is missing."""

import pytest

from conftest import run_ddl

pytestmark = pytest.mark.unit


def _checks(proc):
    return {line[5:].split(":")[0]: line[:5].strip() for line in proc.stdout.splitlines()}


def test_local_machine_passes(tmp_path):
    proc = run_ddl("doctor", "--site", "local", "--data-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout
    checks = _checks(proc)
    assert checks["devices"] == "ok" and checks["backend"] == "ok" and checks["data"] == "ok"


def test_missing_data_dir_fails(tmp_path):
    proc = run_ddl("doctor", "--site", "local", "--data-dir", str(tmp_path / "gone"))
    assert proc.returncode == 1
    assert _checks(proc)["data"] == "FAIL"
    assert "gone does not exist" in proc.stdout


def test_gpu_site_inside_a_job_without_gpus_fails(tmp_path):
    """A JSC job on this CPU-only machine: no devices, no IB host name -> FAIL lines."""
    # the other HF offline variables explicitly unset (in-process xsum tests set them)
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "jwb0001", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "", "TRANSFORMERS_OFFLINE": "", "HF_EVALUATE_OFFLINE": ""}
    proc = run_ddl("doctor", "--site", "juwels-booster", env=env)
    assert proc.returncode == 1
    checks = _checks(proc)
    assert checks["devices"] == "FAIL" and checks["rendezvous"] == "FAIL"
    assert checks["offline"] == "FAIL"  # the other three HF variables are unset
    assert checks["launcher"] == "ok"  # torchrun_jsc is installed in the dev venv
    assert "jwb0001i" in proc.stdout
