"""``docclass serve`` stops cleanly: a real server, a request in flight, a signal, then nothing.

What systemd and ``docker stop`` send is SIGTERM to the server's process alone, so that is what
the tests send: not to the process group, which would reach the workers directly.
"""

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

import pytest

from benchmarks.server import HOST, free_port, request

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads processes from /proc")

TEXT = "Shares in the bank rose after it reported record quarterly profits."
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0
# Long enough that the request is still waiting for a model call when the signal arrives,
# so the test sees it drained, not merely finished before.
BATCH_WAIT_S = 3.0


@pytest.fixture(scope="module")
def ckpt(fitted):
    return fitted / "checkpoints" / "last.ckpt"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, process group, start time)`` of a process, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[2]), int(fields[19])


def _descendants(pid: int) -> set[int]:
    found = set()
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids = [int(child) for child in children.read_text().split()]
        except OSError:
            continue
        for child in pids:
            found |= {child, *_descendants(child)}
    return found


def _exited(pid: int, state: str) -> bool:
    """A zombie holds nothing once its threads are gone; until then its main thread shows
    ``Z`` while the others still hold its files (the port among them)."""
    if state != "Z":
        return False
    try:
        return len(list(Path(f"/proc/{pid}/task").iterdir())) <= 1
    except OSError:
        return True


def _running(group: int, known: dict[int, int]) -> set[int]:
    """Processes still running in ``group``, or among ``known`` pids (each with its start
    time, so a reused pid is not mistaken for one of them)."""
    running = set()
    for entry in Path("/proc").iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat and stat[1] == group and not _exited(int(entry.name), stat[0]):
            running.add(int(entry.name))
    for pid, started in known.items():
        stat = _stat(pid)
        if stat and stat[2] == started and not _exited(pid, stat[0]):
            running.add(pid)
    return running


def _server_holds(server_port: int, client_port: int) -> bool:
    """The server has accepted this connection and read what the client sent.

    In /proc/net/tcp a connection still in the listen queue has inode 0, and ``rx_queue``
    counts the bytes the server has not read yet.
    """
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues, inode = fields[1], fields[2], fields[4], fields[9]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == (
            client_port
        ):
            return inode != "0" and int(queues.split(":")[1], 16) == 0
    return False


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def _healthy(process: subprocess.Popen, port: int) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"docclass serve exited with {process.returncode} while starting")
    try:
        return request(port, "GET", "/health", timeout=2) == (200, "ok")
    except OSError:
        return False


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        # As the server binds: a connection of the test's in TIME_WAIT does not hold the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _left_running(group: int, started: dict[int, int]) -> list[str]:
    """The command lines of the server's processes still running after a grace period.

    multiprocessing's resource tracker ends as the last process holding its pipe does, a
    moment after the server, so this polls rather than looking once.
    """
    try:
        _wait_for(lambda: not _running(group, started), 30, "every server process ends")
    except TimeoutError:
        pass
    left = []
    for pid in sorted(_running(group, started)):
        try:
            left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return left


def _listeners(port: int) -> list[str]:
    """/proc/net/tcp's lines for sockets on ``port``: what holds it when a test says it is held."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return [line for line in lines if int(line.split()[1].split(":")[1], 16) == port]


def _kill_all(server: subprocess.Popen, started: dict[int, int]) -> None:
    """Whatever the test saw fail, nothing it started stays."""
    for pid in _running(server.pid, started):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if server.poll() is None:
        server.kill()
    server.wait(30)


@contextmanager
def _serving(ckpt: Path, log: Path, *args: str) -> Iterator[tuple[subprocess.Popen, int, dict]]:
    """A ``docclass serve`` process, its port once healthy, and every process it started
    (pid → start time); whatever happens in the block, none of them outlives it."""
    port = free_port()
    command = [sys.executable, "-m", "docclass.cli", "serve", "--ckpt", str(ckpt)]
    command += ["--port", str(port), "--device", "cpu", *args]
    # Its own session, so its process group holds every process it starts (see _running).
    with log.open("w") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    started: dict[int, int] = {}
    try:
        _wait_for(lambda: _healthy(server, port), START_TIMEOUT_S, "/health says ok")
        for pid in _descendants(server.pid):
            stat = _stat(pid)
            if stat:
                started[pid] = stat[2]
        assert len(started) >= 2, "the server started no worker processes to check"
        yield server, port, started
    finally:
        _kill_all(server, started)


def _send_predict(port: int) -> http.client.HTTPConnection:
    """POST one text and return once the server has read the request (it is in flight)."""
    client = http.client.HTTPConnection(HOST, port, timeout=STOP_TIMEOUT_S)
    client.connect()
    body = json.dumps({"texts": [TEXT], "word_scores": False}).encode()
    client.request("POST", "/predict", body, {"content-type": "application/json"})
    client_port = client.sock.getsockname()[1]
    _wait_for(lambda: _server_holds(port, client_port), 60, "the server reads the request")
    return client


def _assert_nothing_left(server: subprocess.Popen, port: int, started: dict[int, int]) -> None:
    assert _left_running(server.pid, started) == []
    # With no process left, nothing may hold the port either.
    assert _port_is_free(port), _listeners(port)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=5).close()


@pytest.mark.fault(
    "serve: SIGTERM (`kill`, `docker stop`) or SIGINT to the server process, a request in flight",
    "the request is answered; then every process the server started ends and the port is free",
)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_drains_the_request_in_flight_and_ends_every_process(ckpt, tmp_path, signum):
    log = tmp_path / "serve.log"
    with _serving(ckpt, log, "--batch_timeout", str(BATCH_WAIT_S)) as (server, port, started):
        client = _send_predict(port)
        try:
            os.kill(server.pid, signum)
            response = client.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["results"][0]["label"]
        finally:
            client.close()
        assert server.wait(STOP_TIMEOUT_S) == 0, log.read_text()
        _assert_nothing_left(server, port, started)


@pytest.mark.slow
@pytest.mark.fault(
    "serve: the server process killed outright (SIGKILL, the OOM killer)",
    "the kernel ends every process it started; the port is free",
)
def test_a_killed_server_takes_its_workers_with_it(ckpt, tmp_path):
    with _serving(ckpt, tmp_path / "serve.log") as (server, port, started):
        server.kill()
        server.wait(STOP_TIMEOUT_S)
        _assert_nothing_left(server, port, started)
