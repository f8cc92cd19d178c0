"""gcp-storage-emulator as a child process on loopback: the store behind the gateway.

Part of the test GCS server (see ``server.py`` for the whole design); it holds
the data, in memory, for one test session or one benchmark.
"""
from __future__ import annotations

import http.client
import http.server
import logging
import pathlib
import socket
import subprocess
import sys
import time
from http import HTTPStatus

_log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

_EMULATOR_START_TIMEOUT_S = 30.0
_EMULATOR_STOP_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.05


def free_port() -> int:
    """A port that the kernel just handed out and nobody holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class _PortTaken(RuntimeError):
    """The emulator exited because another process bound its port first."""


# gcp-storage-emulator's entry point without two costs real GCS does not have.
_EMULATOR_MAIN = pathlib.Path(__file__).with_name("emulator_main.py")


class EmulatorProcess:
    """``gcp-storage-emulator`` as a child process on a free loopback port.

    A process rather than a thread: the emulator is a single-threaded
    ``HTTPServer`` and would otherwise compete for this process's GIL with
    the code under test; it is also how a developer runs it by hand.
    """

    def __init__(self, workdir: pathlib.Path) -> None:
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._log_from = 0  # where this start's lines begin in the log

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> pathlib.Path:
        return self._workdir / "gcp-storage-emulator.log"

    def start(self, tries: int = 3) -> None:
        """Starts the emulator and returns once it answers HTTP.

        The free port is free when chosen, not when the child binds it: a process starting beside
        this one (another pytest-xdist worker's emulator, a Beam worker) can take it first, and the
        child exits. It is then started again on another port.
        """
        for attempt in range(tries):
            try:
                return self._start_once()
            except _PortTaken:
                if attempt == tries - 1:
                    raise

    def _start_once(self) -> None:
        port = free_port()
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, str(_EMULATOR_MAIN), "start",
                 "--host", LOOPBACK, "--port", str(port), "--in-memory"],
                cwd=self._workdir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT)
        self._proc, self.port = proc, port
        try:
            self._wait_until_ready(proc)
        except RuntimeError:
            self.stop()
            raise
        _log.info("gcp-storage-emulator pid %d on %s, log %s", proc.pid, self.url, self.log_path)

    def _wait_until_ready(self, proc: subprocess.Popen[bytes]) -> None:
        """Polls the health endpoint until it answers, the child exits, or time is up."""
        deadline = time.monotonic() + _EMULATOR_START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=2)
            try:
                conn.request("GET", "/")
                response = conn.getresponse()
                if response.status == HTTPStatus.OK and response.read() == b"OK":
                    return
            except OSError:
                pass  # not listening yet, or someone else is
            finally:
                conn.close()
            # Its server thread dies on a port taken; the process stays, and says so in the log.
            if "Address already in use" in (tail := self._log_tail()):
                raise _PortTaken(f"gcp-storage-emulator could not bind port {self.port}:\n{tail}")
            try:  # the pause between polls, cut short if the child exits
                code = proc.wait(timeout=_POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"gcp-storage-emulator exited with {code}:\n{self._log_tail()}")
        raise RuntimeError(f"gcp-storage-emulator did not answer on port {self.port} within "
                           f"{_EMULATOR_START_TIMEOUT_S:.0f} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        """Terminates the child by its PID, killing it if it does not exit."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        proc.terminate()
        try:
            proc.wait(timeout=_EMULATOR_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_EMULATOR_STOP_TIMEOUT_S)
        _log.info("gcp-storage-emulator pid %d stopped (%s)", proc.pid, proc.returncode)

