"""tests/ports.py: servers' ports come from below the ephemeral range, one block per
xdist worker, never twice in a process."""

from __future__ import annotations

from pathlib import Path

from tests.ports import FIRST_PORT, PORTS_PER_WORKER, free_port, free_socket


def test_ports_are_below_the_ephemeral_range_and_not_handed_out_twice() -> None:
    range_file = Path("/proc/sys/net/ipv4/ip_local_port_range")
    ephemeral_start = int(range_file.read_text().split()[0]) if range_file.exists() else 32768
    ports = [free_port() for _ in range(50)]
    with free_socket() as held:
        ports.append(held.getsockname()[1])
    assert len(set(ports)) == len(ports)
    assert all(FIRST_PORT <= port < ephemeral_start for port in ports)
    # this worker's block, which the next worker's does not overlap
    first = min(ports) - (min(ports) - FIRST_PORT) % PORTS_PER_WORKER
    assert all(first <= port < first + PORTS_PER_WORKER for port in ports)
