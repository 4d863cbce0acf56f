"""ddl.contract.host_memory: MemAvailable read from a meminfo file in Linux's format, and 0
(unknown) for a file without the field or none at all; the real /proc/meminfo gives a
plausible number on this Linux machine."""

from __future__ import annotations

import os

import pytest

from ddl.contract.host_memory import available_bytes

pytestmark = pytest.mark.unit

MEMINFO = """MemTotal:       24576000 kB
MemFree:          512000 kB
MemAvailable:    8192000 kB
Buffers:           10240 kB
"""


def test_reads_mem_available_in_bytes(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    assert available_bytes(str(path)) == 8192000 * 1024
    path.write_text(MEMINFO.replace("MemAvailable", "MemSomething"))
    assert available_bytes(str(path)) == 0
    path.write_text("MemAvailable: lots kB\n")
    assert available_bytes(str(path)) == 0
    assert available_bytes(str(tmp_path / "missing")) == 0


def test_this_machine():
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < available_bytes() <= total
