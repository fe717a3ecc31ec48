"""Check that no two processes claim the same --host_idx, before jax.distributed starts.

jax's coordination service answers a second process with an index already taken by
aborting every process of the job from a C++ thread (exit 134, a stack trace, no
Python error to catch). So when the indices come from flags, process 0 first holds a
roll call on the port after the coordinator's: each other process reports its index,
host and pid, and one whose index is taken is told so and stops with one line.
"""

import os
import socket
import threading
import time

from absl import logging

from paxloom.core.errors import UserError

_REPLY_OK = b"ok\n"
MAX_WAIT_S = 60


def port_for(server_addr: str) -> tuple[str, int]:
    host, _, port = server_addr.rpartition(":")
    return host, int(port) + 1


def _identity(host_idx: int) -> bytes:
    return f"{host_idx} {socket.gethostname()}:{os.getpid()}\n".encode()


def start_server(server_addr: str, timeout_s: float) -> None:
    """Process 0: answer the others, in a daemon thread, for `timeout_s` (the time every
    process has to arrive: a duplicate may come after all the others)."""
    _, port = port_for(server_addr)
    try:
        server = socket.create_server(("", port))
    except OSError as error:
        raise UserError(f"--host_idx=0: port {port} (the --server_addr port + 1, for checking "
                        f"process indices) is in use ({error.strerror}): is another process "
                        f"already running with --host_idx=0? Give each process its own index, "
                        f"or choose another --server_addr port") from None
    server.settimeout(1.0)
    threading.Thread(target=_answer, args=(server, timeout_s),
                     name="host-idx-roll-call", daemon=True).start()


def _answer(server: socket.socket, timeout_s: float) -> None:
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    with server:
        while time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                try:
                    index_text, _, who = conn.makefile("rb").readline().decode().partition(" ")
                    index = int(index_text)
                except (OSError, ValueError):
                    continue
                who = who.strip()
                if index in seen and seen[index] != who:
                    conn.sendall(f"taken {seen[index]}\n".encode())
                    continue
                seen[index] = who
                conn.sendall(_REPLY_OK)


def report(server_addr: str, host_idx: int, timeout_s: float) -> None:
    """A process other than 0: report to process 0's roll call (retrying until it is up);
    UserError if another process already has this index."""
    host, port = port_for(server_addr)
    # Bounded apart from jax's own wait: a network that lets only the coordinator's port
    # through must cost a minute at most, not --distributed_timeout_s twice.
    deadline = time.monotonic() + min(timeout_s, MAX_WAIT_S)
    while True:
        try:
            with socket.create_connection((host, port), timeout=10) as conn:
                conn.sendall(_identity(host_idx))
                reply = conn.makefile("rb").readline().decode().strip()
            break
        except OSError:
            if time.monotonic() > deadline:  # jax's own wait reports a missing process 0
                logging.warning("no --host_idx roll call at %s:%d; starting without checking "
                                "that process indices are unique", host, port)
                return
            time.sleep(0.5)
    if reply.startswith("taken"):
        raise UserError(f"--host_idx={host_idx} is already taken by another process "
                        f"({reply.split(' ', 1)[1]}); give each process its own index, "
                        f"0 .. --num_hosts - 1")
