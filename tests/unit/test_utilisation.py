"""The utilisation sampler: real psutil readings of this process; GPU readers say why they
are absent here (no GPU on this machine)."""

import pytest

from ddl.worker.observe import utilisation

pytestmark = pytest.mark.unit


def test_cpu_readings_see_a_busy_process():
    sampler = utilisation.Sampler(rank=3, interval=3600)  # readings taken by hand below
    sampler.start()
    sampler.sample()
    total = 0
    for i in range(3_000_000):  # keep this process busy between two readings
        total += i
    result = sampler.stop()
    assert result["rank"] == 3 and result["samples"] == 2
    assert result["cpu_source"].startswith("psutil")
    assert result["cpu_percent_max"] > 10  # a busy loop: well above idle
    assert result["cpu_percent_mean"] <= result["cpu_percent_max"]
    assert result["device_util_percent_mean"] is None
    assert result["device_source"] == "no accelerator"


def test_gpu_readers_report_why_they_are_unavailable():
    for rocm in (False, True):
        reader, why = utilisation.device_reader("cuda", 0, rocm)
        assert reader is None and "unavailable" in why
