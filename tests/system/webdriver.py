"""A minimal W3C WebDriver client for headless Chromium, over urllib: start chromedriver,
open one session, navigate, run scripts, read the browser console, close.

Why not selenium: it is a test-only need of one test file, and a new package means a new
entry in requirements.lock (regenerated, hash-pinned) and in every venv and image that
installs from it; the handful of WebDriver endpoints used here are plain JSON over HTTP.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]


class Browser:
    """``with Browser() as b: b.open(url); b.run("return document.title")``."""

    def __init__(self, driver: str = "chromedriver", binary: str | None = None,
                 tries: int = 5) -> None:
        for _ in range(tries):  # chromedriver refuses --port=0: pick a free port, retry
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            self.base = f"http://127.0.0.1:{port}"
            if self._ready():
                break
            self._kill()
        else:
            raise RuntimeError(f"{driver} did not start on a free port in {tries} tries")
        options = {"args": ARGS, "binary": binary or shutil.which("chromium") or "chromium"}
        try:
            caps = {"browserName": "chrome", "goog:chromeOptions": options,
                    "goog:loggingPrefs": {"browser": "ALL"}}
            answer = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
            self.session = answer["sessionId"]
        except BaseException:
            self._kill()
            raise

    def _ready(self, timeout: float = 20) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                return bool(self._call("GET", "/status")["ready"])
            except (OSError, RuntimeError):
                time.sleep(0.1)
        return False

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:  # WebDriver errors: {"value": {"error", ...}}
            value = json.loads(exc.read() or b"{}").get("value") or {}
            raise RuntimeError(f"{method} {path}: {value.get('error')}: "
                               f"{value.get('message')}") from None

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """A function body run in the page (``return ...`` gives the value back)."""
        return self._call("POST", f"/session/{self.session}/execute/sync",
                          {"script": script, "args": list(args)})

    def screenshot(self) -> bytes:
        """The visible page as PNG bytes (W3C Take Screenshot)."""
        import base64

        return base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot"))

    def console(self) -> list[dict[str, Any]]:
        """The console entries since the last call: {"level", "message", ...}."""
        return self._call("POST", f"/session/{self.session}/se/log", {"type": "browser"})

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        finally:
            self._kill()

    def __enter__(self):  # -> Self (typing.Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
