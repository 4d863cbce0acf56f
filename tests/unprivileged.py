"""A command as a user whom file modes bind: tests here and in CI run as root, which reads
and writes past any mode. Root keeps its uid (its Python under /root stays readable) but
loses the capabilities that override modes (util-linux's setpriv); a non-root user needs
nothing."""

from __future__ import annotations

import os
import shutil

DROPPED = "-dac_override,-dac_read_search,-fowner"


def bound_by_modes(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    assert setpriv, "root needs setpriv (util-linux) to run a command that file modes bind"
    return [setpriv, f"--bounding-set={DROPPED}", "--inh-caps=-all", *cmd]
