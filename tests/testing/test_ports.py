"""``atari_zarr_testkit.ports``: loopback ports never handed out twice in one process."""

from __future__ import annotations

import socket

from atari_zarr_testkit.ports import LOOPBACK, claim_port, fresh_port


def test_fresh_ports_are_never_handed_out_twice() -> None:
    ports = [fresh_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not any(claim_port(port) for port in ports)  # all recorded as used


def test_a_port_is_claimed_once() -> None:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port = sock.getsockname()[1]
        claim_port(port)  # new, or had by an earlier server of this process
        assert claim_port(port) is False
        assert fresh_port() != port
