"""A local run's Beam worker, started before the run's pipeline exists: ``python -m`` this module.

It imports what a worker needs (Beam's harness, Pillow, numpy, the kernel, the
sinks' code) while the launcher lists the tree, then waits on the socket its
launcher gave it (``warm_pool``) for a relay's connection: the process Beam
started as its worker (``warm_pool.RELAY``). It reads the relay's environment
(the control service's address, the options) and its stdout and stderr, becomes
the worker Beam asked for, and answers with its exit status, which the relay
exits with. Its launcher gone, or the relay never coming, it exits at once.

One process imports for all the workers the launcher starts at once: it is
given a socket for each (``sys.argv[1]``, their descriptors joined by commas),
and once its imports are done it forks a copy of itself for each socket but the
first, which it serves itself. A fork costs milliseconds of a core where a fresh
interpreter's imports cost a second or more, and the copies share the imported
modules' memory. Each worker says it is ready by sending its process id on its
socket (``READY``), which the launcher reads before it hands a relay over. The
first process reaps its copies before it exits, so that their CPU is counted as
their launcher's.

Its command line names Beam's worker module (``sys.argv[2]``), so that
anyone's ``ps`` knows it and its copies for workers (the launcher knows them by
the ids it recorded: ``interrupt.Started``), and then ``LOCAL`` where its run
reads and writes local files only (its import then leaves out
``lean_imports.LOCAL_UNUSED``). The command's own first process is instead a
fork of its launcher, which runs ``serve`` with its imports done and names
itself (``interrupt.name_worker``).
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import sys

__all__ = ["main", "prepare", "serve"]

# A worker's first message to its launcher, once it waits for a relay: its process id.
READY = struct.Struct("!I")
# The relay's first message: its environment, as JSON of this many bytes (network order).
LENGTH = struct.Struct("!I")
# Sent to the relay on taking it over: it sends its environment next.
TAKEN = b"W"
# Sent to the relay by the launcher when no worker waits: it starts Beam's worker itself.
COLD = b"C"
# Sent to the relay in place of a status by a worker that could not take it over: it starts Beam's worker.
COLD_STATUS = b"cold\n"
# The last argument of a worker whose run reads and writes local files only.
LOCAL = "--local"
# The most an environment may be: a relay's larger message is refused (a status of 1).
_MAX_ENVIRONMENT = 1 << 24


def prepare(local: bool = False) -> None:
    """The imports a worker's first bundle would pay for. Silent: until a relay is handed over,
    this process's stderr is the command's console, not the job's log; an import that fails
    here fails again where Beam reports it."""
    with contextlib.suppress(Exception):
        from beam_prep.write.run.lean_imports import import_beam

        import_beam("apache_beam.runners.worker.sdk_worker_main", local=local)  # Beam's harness and its protos
        from beam_prep.write.sinks import shard_sinks  # noqa: F401 - the DoFns, imaging, the kernel, GZIP


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the relay closed its connection")
        data += chunk
    return bytes(data)


def _relay_of(launcher: socket.socket) -> socket.socket | None:
    """The relay's connection, as the launcher hands it over; None where the launcher closed its end."""
    try:
        _, fds, _, _ = socket.recv_fds(launcher, 1, 1)
    except OSError:
        return None
    if not fds:
        return None
    relay = socket.socket(fileno=fds[0])
    # Blocking, whatever the launcher's socket module had for a default timeout (Beam's GCP
    # credentials set one), since the flag goes with the descriptor.
    relay.setblocking(True)
    return relay


def _take_over(relay: socket.socket) -> dict[str, str]:
    """The relay's environment; its stdout and stderr become this process's."""
    relay.sendall(TAKEN)
    header, fds, _, _ = socket.recv_fds(relay, LENGTH.size, 2)
    try:
        if len(fds) != 2:
            raise ValueError("a relay sent no stdout and stderr")
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
    finally:
        for fd in fds:
            os.close(fd)
    (size,) = LENGTH.unpack(header + _read_exactly(relay, LENGTH.size - len(header)))
    if size > _MAX_ENVIRONMENT:
        raise ValueError(f"a relay's environment of {size} bytes")
    environment = json.loads(_read_exactly(relay, size))
    if not isinstance(environment, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environment.items()):
        raise ValueError("a relay's environment is not a map of strings")
    return environment


def _closed(fd: int) -> bool:
    """Whether the launcher has closed its end of socket ``fd`` (a worker it no longer needs)."""
    poller = select.poll()  # not select(): a descriptor may be numbered past its 1024
    poller.register(fd, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return os.read(fd, 1) == b""  # the launcher sends nothing before a worker is ready
    except OSError:
        return True


def _fork(fds: list[int]) -> tuple[int, list[int]]:
    """A worker for each of ``fds``: this process serves the first, a fork of it each other one
    the launcher still needs. Returns the descriptor this process serves, and in the first
    process the forks' ids (none in a fork). Where a fork fails, that socket is closed: its
    relay goes to another worker, or starts Beam's own."""
    children: list[int] = []
    for index, fd in enumerate(fds[1:], 1):
        pid = -1
        if not _closed(fd):
            with contextlib.suppress(OSError):
                pid = os.fork()
        if pid == 0:
            for other in (fds[0], *fds[index + 1:]):  # those before it were closed before it forked
                os.close(other)
            return fd, []
        os.close(fd)
        if pid > 0:
            children.append(pid)
    return fds[0], children


def _reap(children: list[int]) -> None:
    for pid in children:
        with contextlib.suppress(ChildProcessError, InterruptedError):
            os.waitpid(pid, 0)


def main(argv: list[str]) -> int:
    """Runs the workers for the relays handed over on the file descriptors ``argv[1]`` (joined by
    commas): this process the first, a fork of it each other one; returns this process's status."""
    return serve([int(fd) for fd in argv[1].split(",")], local=argv[3:4] == [LOCAL])


def serve(fds: list[int], local: bool = False) -> int:
    """``main``'s work, for a process that already holds the sockets ``fds``: also a fork of the
    launcher itself (``warm_pool.WarmPool.start``), whose imports are then done already."""
    prepare(local=local)
    fd, children = _fork(fds)
    try:
        return _serve(fd)
    finally:
        _reap(children)


def _serve(fd: int) -> int:
    """Says the launcher this worker is ready, then serves the relay it hands over on ``fd``."""
    launcher = socket.socket(fileno=fd)
    launcher.setblocking(True)
    try:
        launcher.sendall(READY.pack(os.getpid()))
    except OSError:
        launcher.close()
        return 0  # the launcher no longer needs this worker
    relay = _relay_of(launcher)
    launcher.close()
    if relay is None:
        return 0
    with relay:
        try:
            environment = _take_over(relay)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                relay.sendall(COLD_STATUS)  # the relay starts Beam's worker itself
            return 1
        os.environ.clear()
        os.environ.update(environment)
        from apache_beam.runners.worker import sdk_worker_main

        status = 1
        try:
            sdk_worker_main.main([sdk_worker_main.__file__])
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                relay.sendall(f"{status}\n".encode())
            except OSError:
                pass
    return status


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # At once: the harness has closed its log handler and the DoFns their files, and the
    # interpreter's teardown (modules, gRPC's threads) is a second's wait for the launcher,
    # which reaps its workers.
    os._exit(code)
