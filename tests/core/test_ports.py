"""free_port: below the ephemeral range, one block per xdist worker, never the same port twice in a row."""

import os
import socket
import subprocess
import sys

from packscope.core.ports import free_port


def test_ports_come_free_from_below_the_ephemeral_range_and_do_not_repeat():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(20000 <= p < 32000 for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free indeed


def test_each_xdist_worker_has_a_block_of_its_own():
    code = "from packscope.core.ports import free_port; print(free_port())"
    seen = {}
    for worker in ("gw0", "gw1", "gw3"):
        env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        seen[worker] = int(out.stdout)
    size = (32000 - 20000) // 16
    for worker, port in seen.items():
        index = int(worker[2:])
        assert 20000 + index * size <= port < 20000 + (index + 1) * size
