"""`./ddl` for shell scripts a test runs: each call relayed to this pytest process.

The docs' runnable blocks (tests/distributed/test_docs_commands.py) are bash scripts that
call `./ddl`. As the venv's console script, each call is a fresh interpreter importing torch
and torchvision or transformers: 2.5-4 CPU s of a tutorial step's 4-9. Here `./ddl` is a
small client instead (standard library only, ``python -I -S``: ~20 ms) that sends its
arguments, working directory and whole environment to a listener thread of the pytest
process. The listener runs the command as conftest.run_ddl_as runs any test's command (a
fork of the fork server that has torch imported, in the client's environment, or a fresh
interpreter when that environment needs one: tests/cli_fork.py) and sends back its exit
code and output, which the client prints (stdout, then stderr) and exits with.

What a block sees differs from a terminal in one way: a command's output comes when it
ends. DDL_TEST_CLI=exec (every command in a fresh interpreter) makes `./ddl` exec the
venv's console script instead. The listener is an abstract Unix socket (Linux; no file,
no path-length limit), one per pytest process, started on first use.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import cli_fork
import rankpool

TIMEOUT_S = 600  # per relayed command, as run_ddl's default
_address: list[str] = []

CLIENT = '''#!{python} -IS
# ./ddl of a test (tests/cli_relay.py): the command runs in the pytest process's fork server
import json, os, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({address!r})
sock.sendall(json.dumps({{"args": sys.argv[1:], "cwd": os.getcwd(),
                          "env": dict(os.environ)}}).encode())
sock.shutdown(socket.SHUT_WR)
reply = json.loads(b"".join(iter(lambda: sock.recv(1 << 16), b"")))
sys.stdout.buffer.write(reply["stdout"].encode())
sys.stdout.flush()
sys.stderr.buffer.write(reply["stderr"].encode())
sys.exit(reply["code"])
'''


def write_ddl(directory: Path, relay: bool | None = None) -> Path:
    """DIRECTORY/ddl: the relay's client, or (``relay=False``, default under
    DDL_TEST_CLI=exec) a wrapper that execs this venv's ddl."""
    ddl = directory / "ddl"
    if cli_fork.enabled() if relay is None else relay:
        ddl.write_text(CLIENT.format(python=sys.executable, address=_listening()))
    else:
        ddl.write_text(f'#!/bin/sh\nexec "{Path(sys.executable).with_name("ddl")}" "$@"\n')
    ddl.chmod(0o755)
    return ddl


def _listening() -> str:
    """The listener's address, started on first use."""
    if not _address:
        rankpool.context()  # the fork server started here, not in a listener thread
        address = f"\0ddl-relay-{os.getpid()}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen()
        threading.Thread(target=_accept, args=(listener,), name="ddl-relay",
                         daemon=True).start()
        _address.append(address)
    return _address[0]


def _accept(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_answer, args=(conn,), daemon=True).start()


def _answer(conn: socket.socket) -> None:
    from conftest import run_ddl_as

    with conn:
        request = json.loads(b"".join(iter(lambda: conn.recv(1 << 16), b"")))
        try:
            done = run_ddl_as(request["args"], env=request["env"], cwd=Path(request["cwd"]),
                              timeout=TIMEOUT_S)
            # a command ended by signal N exits as a shell reports it: 128 + N
            reply = {"code": done.returncode if done.returncode >= 0
                     else 128 - done.returncode, "stdout": done.stdout,
                     "stderr": done.stderr}
        except BaseException as exc:  # noqa: BLE001 - a timeout is pytest.fail's Failed
            reply = {"code": 128 + signal.SIGKILL, "stdout": "",
                     "stderr": f"cli_relay: {type(exc).__name__}: {exc}\n"}
        conn.sendall(json.dumps(reply).encode())
