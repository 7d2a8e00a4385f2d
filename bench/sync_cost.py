"""What one host sync costs inside a Hugging Face Trainer run, uncounted and counted by the agent's
debug-mode sync counter, on CUDA: the counter's price is paid once per sync the trainer makes,
after the sync (torch turns its sync warning into a Python warning once the op has returned, so
the GPU is idle while it is handled).

The run: `integration_overhead.py`'s HF Trainer (Qwen2 303M, bf16, accumulation 2) with the
packscope callback counting syncs. Right after each optimizer step (cold: a step of training ran
in between, as for the Trainer's own syncs) one `bool(torch.isnan(x).any())` on a 4-element tensor
of an idle GPU is timed with perf_counter, the variants in turn:

* uncounted: the sync debug mode off;
* counted: the debug mode on, the counter's handler counting it (what the default agent does);
* noop_handler: the debug mode on, `warnings.showwarning` a no-op (the warning machinery alone);
* ignored: the debug mode on, an "ignore" filter first (torch's warning and CPython's filter
  match, no Python handler at all).

After the last step, the same 300 times each in a loop (hot). If counted, no-op and ignored cost
alike, the price lies in torch's warning path, not in the counter's handler (what the H200 showed:
docs/benchmarks/2026-12-03-h200.md, "H200, 2026-12-03, evening").

    python bench/sync_cost.py [--steps 48] [--out F]

Prints one JSON object (and writes it to --out). Needs CUDA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import warnings
from typing import Any

import torch
from integration_overhead import emit, flops_spec, hf_trainer, make_model
from transformers import TrainerCallback

from packscope.agent.integrations.hf import PackscopeCallback
from packscope.agent.syncs import SYNC_WARNING

VARIANTS = ("uncounted", "counted", "noop_handler", "ignored")
HOT_ROUNDS = 300


def timed_sync(x: torch.Tensor, variant: str) -> float:
    """µs of one sync on an idle GPU, under `variant`; the counter's own settings restored after."""
    torch.cuda.synchronize()
    show, filters = warnings.showwarning, list(warnings.filters)
    torch.cuda.set_sync_debug_mode(0 if variant == "uncounted" else "warn")
    if variant == "noop_handler":
        warnings.showwarning = lambda *args, **kwargs: None
    elif variant == "ignored":
        warnings.filterwarnings("ignore", message=f".*{SYNC_WARNING}.*")
    t0 = time.perf_counter()
    bool(torch.isnan(x).any())
    spent = time.perf_counter() - t0
    warnings.showwarning, warnings.filters[:] = show, filters  # type: ignore[index]
    torch.cuda.set_sync_debug_mode("warn")  # as the installed counter keeps it
    return 1e6 * spent


def figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
    }


class Measure(TrainerCallback):
    """One timed sync after every step from the fourth, the variants in turn; the hot loop after the
    last step (before on_train_end, while the counter is still installed)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.x = torch.ones(4, device="cuda")
        self.cold: dict[str, list[float]] = {v: [] for v in VARIANTS}
        self.hot: dict[str, list[float]] = {v: [] for v in VARIANTS}
        self.context: dict[str, Any] = {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < 4:
            return
        variant = VARIANTS[state.global_step % len(VARIANTS)]
        self.cold[variant].append(timed_sync(self.x, variant))
        if state.global_step == self.steps:
            ours = [i for i, f in enumerate(warnings.filters) if f[1] is not None and SYNC_WARNING in f[1].pattern]
            self.context = {
                "warnings_filters": len(warnings.filters),
                "counter_filter_at": ours,
                "threads": sorted(t.name for t in threading.enumerate()),
            }
            for _ in range(HOT_ROUNDS):
                for v in VARIANTS:
                    self.hot[v].append(timed_sync(self.x, v))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs CUDA: the sync debug mode and its warnings exist only there")
    model = make_model("qwen2-303m", "cuda")
    # Every interval counted: a sync is what this prices, counted or not by the variant's settings.
    callback = PackscopeCallback(
        run_name="sync-cost", model=flops_spec(), log_every=10, count_syncs=True, count_syncs_every=1
    )
    measure = Measure(args.steps)
    hf_trainer(model, args.steps, [callback, measure], "cuda").train()
    result = {
        "bench": "sync_cost",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "steps": args.steps,
        **measure.context,
        "cold_us": {v: figures(s) for v, s in measure.cold.items()},
        "hot_us": {v: figures(s) for v, s in measure.hot.items()},
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
