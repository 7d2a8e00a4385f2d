"""docs/deploy.md's deployment, at a small scale: several `packscope serve` processes over one
PostgreSQL database, started at once, behind one address (a round-robin TCP proxy standing in
for nginx or a load balancer). A write through any of them reaches the live streams held by the
others, and the others keep serving when one stops."""

import asyncio
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import httpx
import pytest

from tests.backend.conftest import run_body
from tests.backend.test_processes import wait_until_serving
from tests.backend.uvicorn_server import free_port

SERVERS = 3


@contextmanager
def round_robin(ports: list[int]) -> Iterator[int]:
    """A TCP proxy on a free port that sends each new connection to the next of `ports`."""
    port = free_port()
    targets = itertools.cycle(ports)
    loop = asyncio.new_event_loop()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", next(targets))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
        started.set()
        loop.run_forever()
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.mark.slow
@pytest.mark.postgres
def test_servers_behind_one_address_share_one_postgresql_database(postgres, records):
    env = {**os.environ, "PACKSCOPE_INGEST_TOKEN": "1ngest", "PACKSCOPE_READ_TOKEN": "r3ad"}
    ports = [free_port() for _ in range(SERVERS)]
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "packscope",
                "serve",
                "--port",
                str(port),
                "--database-url",
                postgres,
                "--no-access-log",
            ],
            env=env,
            stderr=subprocess.PIPE,
        )
        for port in ports  # all at once, on a database nobody migrated yet
    ]
    try:
        for server, port in zip(servers, ports, strict=True):
            wait_until_serving(server, port)
        with round_robin(ports) as front:
            url = f"http://127.0.0.1:{front}"
            write = {"Authorization": "Bearer 1ngest"}
            read = {"Authorization": "Bearer r3ad"}
            assert httpx.post(f"{url}/api/v1/runs", json=run_body(), headers=write).status_code == 201
            events: queue.Queue[int] = queue.Queue()

            def listen() -> None:
                with (
                    suppress(httpx.HTTPError),
                    httpx.stream("GET", f"{url}/api/v1/runs/run-1/stream", headers=read, timeout=30) as answer,
                ):
                    lines = answer.iter_lines()
                    for line in lines:
                        if line == "event: interval":
                            events.put(json.loads(next(lines).removeprefix("data: "))["interval"])

            for _ in range(SERVERS):  # a stream on each server (the proxy deals connections in turn)
                threading.Thread(target=listen, daemon=True).start()
            time.sleep(1.0)
            for k in range(SERVERS):  # each batch through a new connection: another server each time
                batch = {"intervals": records(1, start=k)}
                answer = httpx.post(f"{url}/api/v1/runs/run-1/intervals", json=batch, headers=write)
                assert answer.status_code == 200, answer.text
                got = sorted(events.get(timeout=10) for _ in range(SERVERS))
                assert got == [k] * SERVERS  # every server's stream heard of it
            counts = {httpx.get(f"{url}/api/v1/runs/run-1", headers=read).json()["records"] for _ in range(SERVERS)}
            assert counts == {SERVERS}
            servers[0].terminate()
            servers[0].wait(20)

            def runs_list() -> int | None:
                try:
                    return httpx.get(f"{url}/api/v1/runs", headers=read).status_code
                except httpx.TransportError:  # the stopped server's turn: a real proxy retries it elsewhere
                    return None

            answers = [runs_list() for _ in range(SERVERS)]
            assert answers.count(200) == SERVERS - 1 and answers.count(None) == 1, answers
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(20)
