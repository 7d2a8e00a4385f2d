"""`packscope flops`: the agent's FLOPs formula as a calculator for packs of documents."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from packscope.core.flops import packs_breakdown
from packscope.core.hf_config import HFConfigError, read_hf_config


def _pack(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a pack is comma-separated integers, got {text!r}") from None
    if not lengths:
        raise argparse.ArgumentTypeError("a pack needs at least one document length")
    return lengths


def add_flops_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf-config", required=True, metavar="PATH", help="a Hugging Face config.json (or its folder)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (pads the vocabulary), default 1")
    p.add_argument(
        "--pack",
        type=_pack,
        action="append",
        required=True,
        metavar="L1,L2,...",
        help="one pack's document lengths; repeat for more packs",
    )
    p.add_argument(
        "--pack-length", type=int, default=None, help="token slots of every pack (default: the largest pack's total)"
    )


def flops_from_args(args: argparse.Namespace) -> int:
    try:
        if args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        model = read_hf_config(args.hf_config, tp=args.tp)
        result = packs_breakdown(model, args.pack, args.pack_length)
    except (HFConfigError, ValueError) as exc:
        print(f"packscope flops: error: {exc}", file=sys.stderr)
        return 2
    out = dataclasses.asdict(result)
    out.update(
        c_lin=model.c_lin,
        c_core=model.c_core,
        padded_vocab=model.padded_vocab,
        overcount_pct=100.0 * (result.flops_bshd / result.flops_thd - 1.0),
    )
    print(json.dumps(out, indent=2))
    return 0
