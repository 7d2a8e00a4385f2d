"""One load-generator process of bench/ingest_fanin.py: a share of the job's connections, each a
keep-alive HTTP/1.1 connection on raw asyncio streams (as an agent's sender holds one), sending
one record a request OPEN LOOP: connection g of C sends its k-th request at t0 + (g + k·C) / rate,
whatever became of the ones before, so the whole job offers `rate` requests/s evenly spread.
A connection sends its ranks in turn (ranks g, g + C, g + 2C, …): its k-th request is the record of
its rank k mod n for interval k div n. Latency is from the scheduled send time, so a request held
behind its connection's previous answer (or behind a late event loop) counts that wait.

Run by ingest_fanin.py, not by hand: it prints "ready" once its connections are open, reads t0
(time.monotonic(), one clock for every process of the machine) from stdin, and writes one JSON
object of what it saw, once its last answer came, to --out (a file: stdout's pipe may be left
non-blocking by the event loop, and a large write to it can come out cut).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Any

from bench_data import record

ANSWER_WITHIN_S = 30.0  # an answer later than this is an error (the server stalled), not a wait
REUSE_IDLE_S = 4.0  # under the server's keep-alive (5 s): an older idle connection is opened anew
OPENING_AT_ONCE = 64  # connections being opened at one time (the server's accept backlog)
STEPS = 10
# Placeholders the numbers of a request replace: each template is serialised once.
_HOLES = {"interval": -777000001, "rank": -777000002, "first_step": -777000003, "last_step": -777000004}


class Template:
    """A record's JSON with holes for its key: a body costs a few string joins, not a json.dumps."""

    def __init__(self, rng: random.Random) -> None:
        text = json.dumps({"intervals": [{**record(0, 0, rng), **_HOLES}]})
        self.parts: list[str] = []
        self.order: list[str] = []
        for name, hole in sorted(_HOLES.items(), key=lambda item: text.index(str(item[1]))):
            before, _, text = text.partition(str(hole))
            self.parts.append(before)
            self.order.append(name)
        self.parts.append(text)

    def body(self, interval: int, rank: int) -> bytes:
        numbers = {"interval": interval, "rank": rank, "first_step": interval * STEPS + 1}
        numbers["last_step"] = (interval + 1) * STEPS
        out = [self.parts[0]]
        for name, part in zip(self.order, self.parts[1:], strict=True):
            out += (str(numbers[name]), part)
        return "".join(out).encode()


class Connection:
    """One keep-alive HTTP/1.1 connection: a request, then its answer (no pipelining, as a sender)."""

    def __init__(self, host: str, port: int, head: bytes) -> None:
        self.host, self.port, self.head = host, port, head
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.used_at = 0.0
        self.opened = 0

    async def open(self) -> None:
        self.close()
        self.streams = await asyncio.open_connection(self.host, self.port)
        self.used_at = time.monotonic()
        self.opened += 1

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        # A connection idle past the server's keep-alive may be closing as we write: the request
        # would be lost unanswered, so it is opened anew first (counted).
        if self.streams is None or self.streams[0].at_eof() or time.monotonic() - self.used_at > REUSE_IDLE_S:
            await self.open()
        assert self.streams is not None
        reader, writer = self.streams
        try:
            writer.write(self.head + b"%d\r\n\r\n" % len(body) + body)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("the server closed the connection")
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            answer = await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError):
            self.close()
            raise
        self.used_at = time.monotonic()
        return int(status_line.split()[1]), answer


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []  # from the scheduled send time to the answer's end
        self.start_lag: list[float] = []  # from the scheduled send time to the write
        self.statuses: Counter[str] = Counter()  # "200", "503", ..., or an exception's name
        self.acknowledged: list[tuple[int, int]] = []  # (rank, interval) answered 200, accepted 1
        self.not_accepted = 0  # 200 but counted a duplicate: a key sent twice
        self.unanswered: list[tuple[int, int]] = []  # no answer: stored or not, nobody knows


async def connection_loop(
    connection: Connection, g: int, args: argparse.Namespace, t0: float, templates: list[Template], tally: Tally
) -> None:
    ranks = list(range(g, args.ranks, args.connections))
    template = templates[g % len(templates)]
    end = t0 + args.seconds
    k = 0
    while (scheduled := t0 + (g + k * args.connections) / args.rate) < end:
        wait = scheduled - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        rank, interval = ranks[k % len(ranks)], k // len(ranks)
        k += 1
        body = template.body(interval, rank)
        tally.start_lag.append(time.monotonic() - scheduled)
        try:
            status, answer = await asyncio.wait_for(connection.post(body), ANSWER_WITHIN_S)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            connection.close()  # a late answer must not be read as the next request's
            tally.statuses[type(exc).__name__] += 1
            tally.unanswered.append((rank, interval))
            continue
        tally.latencies.append(time.monotonic() - scheduled)
        tally.statuses[str(status)] += 1
        if status == 200:
            if json.loads(answer)["accepted"] == 1:
                tally.acknowledged.append((rank, interval))
            else:
                tally.not_accepted += 1


async def generate(args: argparse.Namespace) -> dict[str, Any]:
    host, _, port = args.url.removeprefix("http://").partition(":")
    head = (
        f"POST /api/v1/runs/{args.run_id}/intervals HTTP/1.1\r\nHost: {host}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()
    mine = range(args.first, args.first + args.count)
    connections = {g: Connection(host, int(port), head) for g in mine}
    opening = asyncio.Semaphore(OPENING_AT_ONCE)

    async def open_one(connection: Connection) -> None:
        async with opening:
            await connection.open()

    await asyncio.gather(*(open_one(c) for c in connections.values()))
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    t0 = float(await loop.run_in_executor(None, sys.stdin.readline))
    cpu0 = time.process_time()
    rng = random.Random(args.first)
    templates = [Template(rng) for _ in range(16)]
    tally = Tally()
    await asyncio.gather(*(connection_loop(c, g, args, t0, templates, tally) for g, c in connections.items()))
    finished = time.monotonic()
    for c in connections.values():
        c.close()
    return {
        "connections": len(connections),
        "reopened": sum(c.opened for c in connections.values()) - len(connections),
        "cpu_s": time.process_time() - cpu0,
        "finished": finished,
        "statuses": dict(tally.statuses),
        "latencies": [round(x, 6) for x in tally.latencies],
        "start_lag": [round(x, 6) for x in tally.start_lag],
        "acknowledged": tally.acknowledged,
        "not_accepted": tally.not_accepted,
        "unanswered": tally.unanswered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--first", type=int, required=True, help="this process's first connection index")
    parser.add_argument("--count", type=int, required=True, help="this process's connections")
    parser.add_argument("--connections", type=int, required=True, help="the job's connections, all processes")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="the job's requests/s, all processes")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--out", required=True, help="the JSON result's file")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(generate(args))
    else:
        result = asyncio.run(generate(args))
    with open(args.out, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
