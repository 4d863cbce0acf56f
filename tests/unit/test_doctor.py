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


def test_cte_power_names_the_environment_it_needs():
    """This machine is x86_64: CTE-POWER's nodes are ppc64le, so the platform check fails
    and says what ddl needs there and where that torch would come from."""
    import platform

    assert platform.machine() != "ppc64le", "this check is written for a non-POWER host"
    proc = run_ddl("doctor", "--site", "cte-power")
    assert proc.returncode == 1
    assert _checks(proc)["platform"] == "FAIL"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL platform:"))
    assert f"this machine is {platform.machine()}; cte-power nodes are ppc64le" in line
    assert "Python >= 3.10 and torch >= 2.7 built for ppc64le + CUDA" in line
    assert "Open-CE's newest is torch 2.1.2" in line and "mn5-acc" in line


def test_torch_build_is_checked_against_the_site():
    """The dev venv's torch is a CUDA (or CPU-only) build: never right for LUMI's ROCm GPUs,
    fine for the CPU site."""
    import torch

    assert not torch.version.hip, "this check is written for a non-ROCm torch"
    proc = run_ddl("doctor", "--site", "lumi-g")
    assert proc.returncode == 1
    assert _checks(proc)["torch"] == "FAIL"
    assert "cannot use lumi-g's ROCm GPUs; the site needs a ROCm build of torch >= 2.7" \
        in proc.stdout
    local = run_ddl("doctor", "--site", "local")
    assert _checks(local)["torch"] == "ok" and _checks(local)["python"] == "ok"
    assert f"torch {torch.__version__} (" in local.stdout


def test_a_gpu_site_without_a_container_runtime_passes():
    """A job without --container needs no apptainer: doctor passes a JSC login node that
    has none (issue 42), and says when it would be needed."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"  # no runtime there
    assert not any(os.path.exists(f"/usr/bin/{n}") or os.path.exists(f"/bin/{n}")
                   for n in ("apptainer", "singularity"))
    proc = run_ddl("doctor", "--site", "juwels-booster", env=env)
    checks = _checks(proc)
    assert checks["container"] == "skip", proc.stdout
    assert "needed only by jobs with --container" in proc.stdout
    assert proc.returncode == 0, proc.stdout


def test_a_cpu_torch_is_not_called_a_cuda_build(monkeypatch):
    from ddl.commands import doctor
    from ddl.launch import environment
    from ddl.settings.sites import get_site

    monkeypatch.setattr(environment, "installed_torch",
                        lambda: environment.TorchBuild("2.7.1+cpu", "cpu", None))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    status, detail = doctor._check_devices(get_site("juwels-booster"))
    assert status == "skip"
    assert "torch 2.7.1+cpu (CPU-only build)" in detail and "CUDA" not in detail


def test_an_unreliable_skew_is_said_and_not_cached(tmp_path, monkeypatch, capsys):
    """`ddl doctor --collectives` whose skew reading stayed too close to divide by (a busy
    machine, planted here: the real probe is tests/distributed/test_doctor_collectives.py)
    prints a note saying so, and the link cache `ddl plan` reads keeps the fits without it."""
    import json

    from ddl.commands import collective_probe, doctor
    from ddl.planning import cpu_calibration

    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path))
    fit = {"latency_s": 1e-4, "bytes_per_s": 1e9, "worst_error": 0.1, "points": 2}
    planted = {"backend": "gloo", "nproc": 2, "repeats": 5,
               "seconds": {op: {"4096": 1e-4, "16777216": 2e-2} for op in ("all_reduce",)},
               "fits": {"all_reduce": fit, "all": fit},
               "skew": {"wait_per_compute": 7.0, "compute_s": [2e-3, 3e-3],
                        "latency_s": [1e-3, 8e-3], "products": [10, 80], "attempts": 3,
                        "reliable": False}}
    monkeypatch.setattr(collective_probe, "measure", lambda nproc, backend: planted)
    assert doctor.run_collectives("local", 2) == 0
    out = capsys.readouterr().out
    assert "note: the two compute blocks took 2.0 and 3.0 ms in the last of 3 tries" in out
    cached = json.loads((tmp_path / cpu_calibration.CACHE_FILE).read_text())
    entry = cached[cpu_calibration.machine_key()]["links-2"]
    assert entry["fits"]["all_reduce"] == fit and "skew" not in entry
