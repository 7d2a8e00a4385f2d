"""A free TCP port on the loopback interface, for the servers that the tests, the benchmarks and
the examples' tests start (and, since nothing listens on it, for a test of an unreachable server).

The kernel's own pick (bind to port 0) comes from the ephemeral range, where every outgoing
connection of the machine also takes its port, and it can hand the same port to two processes
that ask in turn before either binds it: under pytest-xdist a server then found its port taken.
So the port comes from below the ephemeral range, from a block of its own for each xdist worker,
walked in order by each process, and is checked free by binding it."""

import itertools
import os
import random
import socket

_LOW, _HIGH = 20000, 32000  # below Linux's default ephemeral range (32768-60999)
_BLOCKS = 16  # xdist workers gw0..gw15 each get one block; a process outside xdist, any block


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % _BLOCKS if worker.startswith("gw") and worker[2:].isdigit() else None
    size = (_HIGH - _LOW) // _BLOCKS
    if index is None:
        index = random.randrange(_BLOCKS)
    return range(_LOW + index * size, _LOW + (index + 1) * size)


_BLOCK = _block()
_candidates = itertools.cycle(_BLOCK)
for _ in range(random.randrange(len(_BLOCK))):  # processes of one worker start at different places
    next(_candidates)


def free_port() -> int:
    for _ in range(len(_BLOCK)):
        port = next(_candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the whole block is taken: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
