"""free_port: a listening port for a rank to bind seconds later, outside the range the
kernel hands out for outgoing connections (where gloo's pairs took one now and then: a rank
failed with EADDRINUSE in a suite run)."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from ddptui.rank import net


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound(monkeypatch):
    monkeypatch.setattr(net, "ephemeral_range", lambda: (32768, 60999))  # Linux's default
    low = 32768
    for _ in range(20):
        port = net.free_port()
        assert net.LISTEN_PORTS_FROM <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_taken_by_listeners_are_skipped(monkeypatch):
    monkeypatch.setattr(net, "LISTEN_PORTS_FROM", 32700)
    monkeypatch.setattr(net, "ephemeral_range", lambda: (32704, 60999))
    held = []
    try:
        for port in range(32700, 32703):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sock.listen()
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        for _ in range(10):
            assert net.free_port() not in taken
    finally:
        for sock in held:
            sock.close()


def test_no_room_below_the_range_falls_back_to_the_kernel(monkeypatch):
    monkeypatch.setattr(net, "ephemeral_range", lambda: (1024, 65535))
    port = net.free_port()
    assert 0 < port <= 65535


@given(st.binary(max_size=64))
def test_any_range_file_gives_a_sane_range(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("range") / "ip_local_port_range"
    path.write_bytes(content)
    low, high = net.ephemeral_range(str(path))
    assert 0 < low <= high <= 65535


def test_bindable_tells_local_addresses_and_taken_ports():
    from ddptui.run.cluster.addresses import is_local

    assert net.bindable("127.0.0.1") and is_local("127.0.0.1")
    assert not net.bindable("192.0.2.1") and not is_local("192.0.2.1")  # TEST-NET-1
    assert isinstance(net.bindable("::1"), bool)  # IPv6: an answer, never an error
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert not net.bindable("127.0.0.1", held.getsockname()[1])
