"""Free TCP ports on loopback, for services and test clusters started on this machine."""

from __future__ import annotations

import contextlib
import socket


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now: each socket stays bound until
    all are chosen, so the kernel cannot hand the same port out twice.

    >>> a, b = free_ports(2)
    >>> a != b and 0 < a < 65536
    True
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    return free_ports(1, host)[0]
