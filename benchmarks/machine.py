"""What machine a benchmark ran on, recorded with its results (docs quote both)."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time


def describe() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"host": socket.gethostname(), "platform": platform.platform(), "cpu": cpu,
            "cpus": os.cpu_count(), "load_average": load, "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
