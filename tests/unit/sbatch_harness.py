"""Render `ddl submit --dry-run` in-process and run the script under bash with stand-ins for
the Slurm commands (scontrol, srun, getent, module), to see what a job would really do.

The stand-ins are the mock here: no real cluster is reachable. srun prints its arguments
NUL-separated so tests can check that every value arrives intact.
"""

from __future__ import annotations

import os
import subprocess

from ddl.commands.cli import main

OUTPUT_DIR = "/scratch/proj/runs"
FIXED = ["--account", "proj", "--ddl-command", "ddl", "--output-dir", OUTPUT_DIR,
         "--dry-run"]

STUBS = r"""
scontrol() { printf '%s\n' $STUB_NODES; }
getent() {
  [ "$1" = hosts ] || return 2
  local want=$2 line
  for line in "${STUB_HOSTS[@]}"; do
    set -- $line
    if [ "$2" = "$want" ]; then echo "$line"; return 0; fi
  done
  return 2
}
srun() { printf '%s\0' "$@" > "$SRUN_ARGS"; }
module() { :; }
"""


def render(capsys, *args: str) -> str:
    capsys.readouterr()
    code = main(["submit", *FIXED, *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def run_script(script: str, tmp_path, *, nodes: list[str], hosts: dict[str, str],
               job_id: str = "1234567") -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the rendered script; returns the process and the arguments srun received."""
    srun_args = tmp_path / "srun-args"
    srun_args.unlink(missing_ok=True)
    table = " ".join(f"'{ip} {name}'" for name, ip in hosts.items())
    wrapper = f"STUB_HOSTS=({table})\n{STUBS}\n"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "USER": "tester",
           "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": ",".join(nodes),
           "SLURM_NNODES": str(len(nodes)), "SLURM_CPUS_PER_TASK": "7",
           "STUB_NODES": " ".join(nodes), "SRUN_ARGS": str(srun_args)}
    proc = subprocess.run(["bash", "-c", wrapper + 'source /dev/stdin'], input=script,
                          env=env, capture_output=True, text=True, timeout=30)
    # bytes, not read_text(): universal newlines would turn a typed "\r" into "\n"
    args = srun_args.read_bytes().decode().split("\0")[:-1] if srun_args.exists() else []
    return proc, args
