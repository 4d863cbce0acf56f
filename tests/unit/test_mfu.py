"""MFU against hand calculations, and the site peaks it uses."""

import math

import pytest

from ddl.worker import mfu
from ddl.settings.sites import get_site

pytestmark = pytest.mark.unit


def test_mfu_hand_calculation():
    # 1 GFLOP per sample (training), 4000 samples/s over 8 devices of 10 TFLOP/s peak:
    # 1e9 * 4000 / 8 = 5e11 FLOP/s per device; 5e11 / 1e13 = 0.05.
    assert math.isclose(mfu.mfu(1e9, 4000.0, 8, 10e12), 0.05)


def test_mfu_of_the_mnist_cnn_on_an_a100():
    # The BSC CNN's forward multiply-adds (docs/measuring.md): conv1 24*24*32*25 = 460,800,
    # conv2 8*8*64*32*25 = 3,276,800, fc 64*16*10 = 10,240 -> 3,747,840 MACs; training
    # = 3 x 2 x MACs = 22,487,040 FLOPs. 100,000 samples/s on 4 A100s (312 TF each):
    # 22,487,040 * 25,000 / 312e12 = 0.0018018...
    from ddl.contract.plugins import Plugins

    spec = Plugins().workload("mnist")
    flops = spec.create(spec.presets[spec.default_preset]).flops_per_sample()
    assert flops == 22_487_040
    peak = get_site("juwels-booster").device_peak_flops
    assert math.isclose(mfu.mfu(flops, 100_000.0, 4, peak), 22_487_040 * 25_000 / 312e12)


def test_unknown_flops_or_peak_gives_none():
    assert mfu.mfu(None, 100.0, 1, 1e12) is None
    assert mfu.mfu(1e9, 100.0, 1, None) is None
    assert get_site("local").device_peak_flops is None


def test_summary_block():
    block = mfu.summary(2e9, 50.0, 2, 1e12, "test")
    assert block == {"flops_per_sample": 2e9, "achieved_flops_per_device": 5e10,
                     "peak_flops_per_device": 1e12, "peak_source": "test", "mfu": 0.05}


def test_devices_must_be_positive():
    with pytest.raises(ValueError):
        mfu.achieved_flops_per_device(1.0, 1.0, 0)


@pytest.mark.parametrize("site, peak", [("juwels-booster", 312e12), ("jureca-dc", 312e12),
                                        ("lumi-g", 191.5e12), ("cte-power", 125e12)])
def test_site_peaks(site, peak):
    assert get_site(site).device_peak_flops == peak


def test_measured_cpu_peak_is_positive():
    assert mfu.measure_matmul_peak(size=128, repeats=2) > 0
