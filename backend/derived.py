"""Derived metrics from raw sums: the one place where the formulas of docs/wire.md live.

Rates are always ratios of sums over the same window (a chart bucket, a run, one CSV row), never
means of per-interval rates. FLOPs are re-derived from the stored token counts and S2 sums with the
run's model coefficients, so a corrected formula applies to data already stored.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Float, cast, func

from packscope.core.flops import ModelSpec


@dataclass(frozen=True)
class Coefficients:
    """What turns a run's raw sums into FLOPs and MFU."""

    c_lin: int  # FLOPs per token of the linear layers
    c_core: int  # FLOPs per unit of S2 (sum of squared sequence lengths)
    peak_tflops: float | None  # per GPU; None when the GPU is unknown

    @classmethod
    def for_run(cls, model: Mapping[str, Any], hardware: Mapping[str, Any]) -> "Coefficients":
        spec = ModelSpec.from_dict(dict(model))
        return cls(c_lin=spec.c_lin, c_core=spec.c_core, peak_tflops=hardware.get("peak_tflops"))


@dataclass(frozen=True)
class Sums:
    """Raw sums over a set of intervals: one interval, a chart bucket or a whole run."""

    steps: int
    gpu_time_s: float
    gpu_seconds: float  # Σ gpu_time_s · gpus: the GPU time the FLOPs were spread over
    tokens: int
    real_tokens: int
    s2_bshd: float
    s2_thd: float
    documents: int
    packs: int
    syncs: int
    loss_weighted: float | None  # Σ loss · real_tokens over intervals that report a loss
    loss_tokens: int  # Σ real_tokens over those intervals

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Sums":
        """From a mapping with these field names (SQL aggregates may come back as Decimal or None)."""
        def num(key: str, kind: type) -> Any:
            value = row[key]
            return kind(0) if value is None else kind(value)

        loss = row["loss_weighted"]
        return cls(
            steps=num("steps", int),
            gpu_time_s=num("gpu_time_s", float),
            gpu_seconds=num("gpu_seconds", float),
            tokens=num("tokens", int),
            real_tokens=num("real_tokens", int),
            s2_bshd=num("s2_bshd", float),
            s2_thd=num("s2_thd", float),
            documents=num("documents", int),
            packs=num("packs", int),
            syncs=num("syncs", int),
            loss_weighted=None if loss is None else float(loss),
            loss_tokens=num("loss_tokens", int),
        )


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def flops(tokens: Any, s2: Any, c_lin: float, c_core: float) -> Any:
    """FLOPs(T, S2) = T·c_lin + S2·c_core, for numbers or SQL expressions alike."""
    return tokens * c_lin + s2 * c_core


def metrics(s: Sums, c: Coefficients) -> dict[str, Any]:
    """Every derived value of docs/api.md for one window; None where it is undefined (0/0)."""
    f_bshd = float(flops(s.tokens, s.s2_bshd, c.c_lin, c.c_core))
    f_thd = float(flops(s.tokens, s.s2_thd, c.c_lin, c.c_core))
    f_useful = float(flops(s.real_tokens, s.s2_thd, c.c_lin, c.c_core))
    out: dict[str, Any] = {
        "steps": s.steps,
        "gpu_time_s": s.gpu_time_s,
        "tokens": s.tokens,
        "real_tokens": s.real_tokens,
        "documents": s.documents,
        "packs": s.packs,
        "flops_bshd": f_bshd,
        "flops_thd": f_thd,
        "flops_useful": f_useful,
    }
    for kind, f in (("bshd", f_bshd), ("thd", f_thd), ("useful", f_useful)):
        tflops = _ratio(f / 1e12, s.gpu_seconds)
        out[f"tflops_{kind}"] = tflops
        # MFU is a fraction of the GPU's dense peak, not a percentage.
        out[f"mfu_{kind}"] = tflops / c.peak_tflops if tflops is not None and c.peak_tflops else None
    over = _ratio(f_bshd, f_thd)
    out["overcount_pct"] = None if over is None else 100.0 * (over - 1.0)
    out["step_time_s"] = _ratio(s.gpu_time_s, s.steps)
    out["tokens_per_s"] = _ratio(s.tokens, s.gpu_time_s)
    real_share = _ratio(s.real_tokens, s.tokens)
    out["padding_pct"] = None if real_share is None else 100.0 * (1.0 - real_share)
    out["syncs_per_iter"] = _ratio(s.syncs, s.steps)
    # Loss is averaged over real tokens, as the trainer computes it (padding carries no loss).
    out["loss"] = None if s.loss_weighted is None else _ratio(s.loss_weighted, s.loss_tokens)
    return out


def sum_expressions(cols: Any) -> dict[str, ColumnElement[Any]]:
    """SQL aggregates over interval rows (`cols`: a table's or subquery's columns) named as in Sums."""
    real_if_loss = func.coalesce(func.sum(cols.real_tokens).filter(cols.loss.is_not(None)), 0)
    return {
        "steps": func.sum(cols.steps),
        "gpu_time_s": func.sum(cols.gpu_time_s),
        "gpu_seconds": func.sum(cols.gpu_time_s * cols.gpus),
        "tokens": func.sum(cols.tokens),
        "real_tokens": func.sum(cols.real_tokens),
        # S2 sums can pass 2^63 over a long run (SQLite's SUM would raise); rates need no exact S2.
        "s2_bshd": func.sum(cast(cols.seqlen_sq_sum_bshd, Float)),
        "s2_thd": func.sum(cast(cols.seqlen_sq_sum_thd, Float)),
        "documents": func.sum(cols.documents),
        "packs": func.sum(cols.packs),
        "syncs": func.sum(cols.syncs_total),
        "loss_weighted": func.sum(cols.loss * cols.real_tokens),
        "loss_tokens": real_if_loss,
    }


def interval_rate_expressions(cols: Any, c: Coefficients) -> dict[str, ColumnElement[Any]]:
    """Per-interval rates as SQL expressions, for the MIN/MAX band of a chart bucket."""
    # Floats throughout: T·c_lin of one interval already nears the BIGINT range for large models.
    c_lin, c_core = float(c.c_lin), float(c.c_core)
    tokens, real = cast(cols.tokens, Float), cast(cols.real_tokens, Float)
    s2_bshd, s2_thd = cast(cols.seqlen_sq_sum_bshd, Float), cast(cols.seqlen_sq_sum_thd, Float)
    gpu_seconds = func.nullif(cols.gpu_time_s * cols.gpus, 0.0)
    return {
        "tflops_bshd": flops(tokens, s2_bshd, c_lin, c_core) / gpu_seconds / 1e12,
        "tflops_thd": flops(tokens, s2_thd, c_lin, c_core) / gpu_seconds / 1e12,
        "tflops_useful": flops(real, s2_thd, c_lin, c_core) / gpu_seconds / 1e12,
        "step_time_s": cols.gpu_time_s / cols.steps,
    }
