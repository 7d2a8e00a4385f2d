"""Per-channel loss of one micro-batch, before and after the published fix.

Before: a Python loop over the documents of ``cu_seqlens`` (slices from device scalars and a
boolean-mask index: three host syncs per document). After: token -> document ids with
``repeat_interleave(..., output_size=T)`` and one ``index_add_`` of (loss, count) into a
(channels, 2) buffer, flat in the number of documents. The table has the published shape:
131072 tokens split into 128 to 16384 documents, 25% and 100% of tokens labelled.

Times are the median of repeats per call (CUDA events on a GPU, the host clock on the CPU);
each row also checks that both forms agree (token counts exact, loss sums within 1e-5).

    python bench/channel_loss.py [--device cuda] [--repeats 20] [--out channel_loss.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime

import torch

from packscope.trainer.channel_loss import channel_loss_sums, channel_loss_sums_loop
from packscope.trainer.packing import IGNORE

CHANNELS = 4


def problem(
    tokens: int, docs: int, unmasked: float, device: torch.device, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random document boundaries over ``tokens``, per-token losses, labels with a share masked."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(tokens - 1, generator=g)[: docs - 1].add_(1).sort().values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).to(torch.int32)
    labels = torch.randint(1000, (tokens,), generator=g)
    labels[torch.rand(tokens, generator=g) >= unmasked] = IGNORE
    losses = 10 * torch.rand(tokens, generator=g)
    channels = torch.randint(CHANNELS, (docs,), generator=g)
    return losses.to(device), labels.to(device), bounds.to(device), channels.to(device)


def time_call(fn, args, repeats: int, device: torch.device) -> float:
    """Median seconds per call, after one warm-up call."""
    fn(*args, CHANNELS)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args, CHANNELS)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(*args, CHANNELS)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a[:, 1], b[:, 1]) and torch.allclose(a[:, 0], b[:, 0], rtol=1e-5, atol=0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--docs", default="128,1024,4096,16384")
    ap.add_argument("--unmasked", default="0.25,1.0", help="shares of tokens that carry a label")
    ap.add_argument("--repeats", type=int, default=None, help="vectorized calls per row (default: 20 GPU, 5 CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    repeats = args.repeats or (20 if device.type == "cuda" else 5)
    rows = []
    for docs in map(int, args.docs.split(",")):
        for unmasked in map(float, args.unmasked.split(",")):
            data = problem(args.tokens, docs, unmasked, device)
            # The loop costs ~docs x 3 syncs a call: fewer repeats as it grows.
            loop_repeats = max(1, min(repeats, repeats * 256 // docs))
            before = time_call(channel_loss_sums_loop, data, loop_repeats, device)
            after = time_call(channel_loss_sums, data, repeats, device)
            same = equal(channel_loss_sums_loop(*data, CHANNELS), channel_loss_sums(*data, CHANNELS))
            rows.append(
                {
                    "tokens": args.tokens,
                    "documents": docs,
                    "unmasked": unmasked,
                    "before_ms": 1e3 * before,
                    "after_ms": 1e3 * after,
                    "speedup": before / after,
                    "equal": same,
                    "repeats_before": loop_repeats,
                    "repeats_after": repeats,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {
        "bench": "channel_loss",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "results": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(
        f"\n{'docs':>6} {'labelled':>8} {'before ms':>10} {'after ms':>9} {'speedup':>8} {'equal':>6}", file=sys.stderr
    )
    for r in rows:
        print(
            f"{r['documents']:>6} {r['unmasked']:>8.0%} {r['before_ms']:>10.2f} {r['after_ms']:>9.3f} "
            f"{r['speedup']:>7.1f}x {r['equal']!s:>6}",
            file=sys.stderr,
        )
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
