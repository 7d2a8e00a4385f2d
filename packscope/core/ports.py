"""A free TCP port on the loopback interface, for the servers that the tests, the benchmarks and
the examples' tests start: the kernel picks one that nothing holds, which a server binding it at
once gets (and which nothing listens on, for a test of an unreachable server)."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
