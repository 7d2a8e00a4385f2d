"""`packscope flops`: the agent's FLOPs formula as a calculator for packs of documents."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from packscope.core.attention import LAYER_KINDS
from packscope.core.flops import KindBreakdown, ModelSpec, packs_breakdown_by_kind
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


def report(model: ModelSpec, result: KindBreakdown) -> dict[str, Any]:
    """The calculator's JSON: the three numbers, every attention sum and the FLOPs split per kind."""
    return {
        "tokens": result.tokens,
        "real_tokens": result.real_tokens,
        "seqlen_sq_sum_bshd": result.sums["seqlen_sq_sum_bshd"],
        "seqlen_sq_sum_thd": result.sums["seqlen_sq_sum_thd"],
        "flops_bshd": result.flops_bshd,
        "flops_thd": result.flops_thd,
        "flops_useful": result.flops_useful,
        "c_lin": model.c_lin,
        "c_core": model.c_core,
        "padded_vocab": model.padded_vocab,
        "overcount_pct": 100.0 * (result.flops_bshd / result.flops_thd - 1.0),
        "layers_by_kind": {kind: n for kind in LAYER_KINDS if (n := model.layers_of_kind(kind))},
        "window": model.window,
        "chunk": model.chunk,
        "sums": {name: value for name, value in result.sums.items() if name in model.c_core_by_sum},
        "c_core_by_kind": model.c_core_by_kind,
        "c_lin_by_component": {k: v for k, v in model.c_lin_by_component.items() if v},
        "flops_split": {
            view: {"linear": result.linear_flops[view], **result.attention_flops[view]}
            for view in ("bshd", "thd", "useful")
        },
        "not_counted": list(model.not_counted),
    }


def flops_from_args(args: argparse.Namespace) -> int:
    try:
        if args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        model = read_hf_config(args.hf_config, tp=args.tp)
        result = packs_breakdown_by_kind(model, args.pack, args.pack_length)
    except (HFConfigError, ValueError) as exc:
        print(f"packscope flops: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report(model, result), indent=2))
    return 0


__all__ = ["add_flops_arguments", "flops_from_args", "report"]
