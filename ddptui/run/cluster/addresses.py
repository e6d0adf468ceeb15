"""Addresses of a multi-node run: the rendezvous ``HOST:PORT`` and the bind address."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from typing import Any

from ddptui.rank.net import bindable, free_port
from ddptui.run.cluster.slurm import first_node
from ddptui.run.options import ConfigError

#: torchrun's own default rendezvous port, used when the rendezvous host is another machine.
DEFAULT_RDZV_PORT = 29400
MAX_HOST_CHARS = 253


def split_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` → (host, port); ValueError with the reason."""
    value = text.strip()
    if not value or "\x00" in value or any(ch.isspace() for ch in value):
        raise ValueError("must be HOST:PORT")
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
    else:
        host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError("must be HOST:PORT")
    if len(host) > MAX_HOST_CHARS or not all(ch.isalnum() or ch in ".-_:%" for ch in host):
        raise ValueError(f"has a host name no machine can have: {host[:40]!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("needs a port from 1 to 65535")
    return host, int(port)


def join_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_endpoint(name: str, text: Any) -> str:
    flag = "--" + name.replace("_", "-")
    try:
        host, port = split_endpoint(str(text))
    except ValueError as exc:
        raise ConfigError(name, f"{flag} {str(text)[:60]!r} {exc}") from None
    return join_endpoint(host, port)


def resolve(host: str) -> str:
    """The IP address of ``host`` (IPv4 first); OSError when it has none."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def is_local(address: str) -> bool:
    """Whether ``address`` belongs to this machine (a socket can bind it)."""
    return bindable(address)


def outbound_address() -> str:
    """The address this machine reaches other machines from (no packet is sent), or
    127.0.0.1 when it has no route at all."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: a route lookup only
            return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def route_address(host: str) -> str:
    """This machine's address on the way to ``host`` (what torchrun's agent advertises, so
    every node reaches it there rather than at whatever the host name resolves to)."""
    try:
        target = resolve(host)
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((target, 9))  # a route lookup only: nothing is sent
            return str(sock.getsockname()[0])
    except OSError:
        return outbound_address()


def check_bind(text: Any) -> str:
    """An address of this machine to bind the telemetry and join sockets on."""
    value = str(text).strip()
    if not value or "\x00" in value or any(ch.isspace() for ch in value):
        raise ConfigError("bind", f"--bind {value[:60]!r} is not an address")
    try:
        address = str(ipaddress.ip_address(value))
    except ValueError:
        try:
            address = resolve(value) if len(value) <= MAX_HOST_CHARS else ""
        except (OSError, UnicodeError, ValueError):
            address = ""
    if not address:
        raise ConfigError("bind", f"--bind {value[:60]!r} is not an address of this machine")
    if not is_local(address):
        raise ConfigError(
            "bind",
            f"--bind {value[:60]!r} ({address}) is not an address of this machine: node 0 "
            "binds the interface the other nodes reach (see 'ip addr')",
        )
    return address


def default_endpoint(launcher: str, environ: Mapping[str, str] | None = None) -> str:
    """The rendezvous endpoint when none is given: this machine's outbound address and a free
    port; under Slurm, the allocation's first node."""
    if launcher == "slurm":
        env = os.environ if environ is None else environ
        host = first_node(env)
        try:
            local = is_local(resolve(host))
        except OSError:
            local = False
        if local:
            return join_endpoint(host, free_port("0.0.0.0"))
        job = str(env.get("SLURM_JOB_ID", "0"))
        return join_endpoint(host, DEFAULT_RDZV_PORT + (int(job) % 1000 if job.isdigit() else 0))
    host = outbound_address()
    return join_endpoint(host, free_port(host))
