"""Start ``docclass serve`` as a child process and talk to it over loopback HTTP.

Used by the server's tests and its load test; both need a real server process, started and
stopped cleanly (LitServe's model workers are its children, so the whole process group goes).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


def free_port() -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    connection: http.client.HTTPConnection | None = None,
    timeout: float = 60.0,
) -> tuple[int, Any]:
    """``(status, parsed JSON body or text)``; reuses ``connection`` when given (keep-alive)."""
    own = connection is None
    conn = connection or http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
    finally:
        if own:
            conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", "replace")


def post_json(port: int, payload: Any, **kwargs) -> tuple[int, Any]:
    """POST ``payload`` as JSON to ``/predict``."""
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    return request(port, "POST", "/predict", body, headers, **kwargs)


@contextmanager
def running_server(
    ckpt: str | Path,
    port: int | None = None,
    extra_args: list[str] | None = None,
    log_path: str | Path | None = None,
    start_timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> Iterator[int]:
    """Run ``docclass serve`` until the block ends; yields its port once ``/health`` says ok.

    ``env`` adds environment variables for the server (the rest are inherited).
    """
    port = port or free_port()
    command = [sys.executable, "-m", "docclass.cli", "serve", "--ckpt", str(ckpt)]
    command += ["--port", str(port), "--log_level", "warning", *(extra_args or [])]
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"docclass serve exited with {process.returncode}: {command}")
            try:
                status, body = request(port, "GET", "/health", timeout=2)
                if status == 200 and body == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"docclass serve not healthy after {start_timeout:.0f} s")
            time.sleep(0.25)
        yield port
    finally:
        _stop(process)
        if log is not subprocess.DEVNULL:
            log.close()


def _stop(process: subprocess.Popen) -> None:
    """Ctrl+C for the whole group (server and its workers), then kill whatever is left."""
    try:
        os.killpg(process.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(5)
