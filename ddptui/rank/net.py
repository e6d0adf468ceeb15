"""Small network facts shared by the launchers and the trainers."""

from __future__ import annotations

import random
import socket

#: Where a listening port is looked for when the kernel's ephemeral range leaves room below it.
LISTEN_PORTS_FROM = 15000
#: Ports tried below the ephemeral range before the kernel is asked for one.
LISTEN_TRIES = 64
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where it
    cannot be read or makes no sense)."""
    try:
        with open(path, encoding="ascii") as handle:
            low, high = (int(word) for word in handle.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return (low, high) if 0 < low <= high <= 65535 else (32768, 60999)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (a rendezvous or init port).

    The port is bound later, by a rank seconds from now. One the kernel hands out (port 0)
    lies in the ephemeral range, where every outgoing connection on the machine (gloo's
    pairs, other runs' stores) takes its local port meanwhile, so it is taken now and then
    before the rank binds it (EADDRINUSE). A random port below that range is taken only by
    another listener; the kernel's choice is the fallback where no such room is free.
    """
    low, _high = ephemeral_range()
    if low - 1 > LISTEN_PORTS_FROM:
        for port in random.sample(
            range(LISTEN_PORTS_FROM, low), min(LISTEN_TRIES, low - LISTEN_PORTS_FROM)
        ):
            if bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def bindable(host: str, port: int = 0) -> bool:
    """Whether a TCP socket can bind ``host:port`` now (port 0: whether ``host`` is an
    address of this machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, port))
    except OSError:
        return False
    return True
