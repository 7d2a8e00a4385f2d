"""What the HF callback's cross-document check costs at train begin, per model: building the tiny
copy and checking the batch forms the collators make (agent/integrations/cross_documents.py,
``check_common_forms``), on the CPU, for the tiny configs of tests/core and the published configs
of tests/fixtures/hf/published (built from their real config, shrunk by the check itself).

    python bench/cross_documents_check.py [--repeat 3] [--threads 1]

Prints one JSON object: per model, the build and check times (ms; the median and range of the
repeats) and the verdict per form. Nothing here runs on a training step: it is the one-off price
of a run's first step.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from packscope.agent.integrations.cross_documents import COMMON_FORMS, CrossDocumentCheck, form_text  # noqa: E402

TINY: dict[str, dict[str, Any]] = runpy.run_path(str(ROOT / "tests" / "core" / "tiny_configs.py"))["TINY"]

PUBLISHED = ROOT / "tests" / "fixtures" / "hf" / "published"
EAGER_ONLY = ("gpt_oss", "gemma2")  # transformers 5.25 refuses sdpa for them


def configs() -> dict[str, object]:
    out: dict[str, object] = {}
    raw = {f"tiny:{name}": dict(cfg) for name, cfg in TINY.items()}
    raw |= {f"published:{p.stem}": json.loads(p.read_text()) for p in sorted(PUBLISHED.glob("*.json"))}
    for name, cfg in raw.items():
        cfg = dict(cfg)
        model_type = cfg.pop("model_type")
        try:
            config = AutoConfig.for_model(model_type, **cfg)
        except Exception as exc:  # noqa: BLE001 - a fixture transformers cannot read: named, skipped
            print(f"skipped {name}: {type(exc).__name__}", file=sys.stderr)
            continue
        config.use_cache = False  # what the Trainer sets
        config._attn_implementation = "eager" if model_type in EAGER_ONLY else "sdpa"
        out[name] = config
    return out


def model_class(config: Any) -> Any:
    wrapper = config.get_text_config() is not config
    return (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING if wrapper else MODEL_FOR_CAUSAL_LM_MAPPING)[type(config)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a trainer's CPU is busy)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    results: dict[str, dict[str, Any]] = {}
    for name, config in configs().items():
        build, check, verdicts = [], [], {}
        for _ in range(args.repeat):
            started = time.perf_counter()
            c = CrossDocumentCheck(config, model_class(config))
            c.build()
            built = time.perf_counter()
            verdicts = {form_text(f): c.verdict(f).status for f in COMMON_FORMS}
            build.append(1000 * (built - started))
            check.append(1000 * (time.perf_counter() - built))
        results[name] = {
            "build_ms": round(statistics.median(build), 1),
            "build_ms_range": [round(min(build), 1), round(max(build), 1)],
            "check_ms": round(statistics.median(check), 1),
            "check_ms_range": [round(min(check), 1), round(max(check), 1)],
            "verdicts": verdicts,
        }
        print(f"{name}: {results[name]['build_ms']} + {results[name]['check_ms']} ms", file=sys.stderr)
    totals = [r["build_ms"] + r["check_ms"] for r in results.values()]
    summary = {"models": len(results), "total_ms_median": statistics.median(totals), "total_ms_max": max(totals)}
    print(json.dumps({"threads": args.threads, "repeat": args.repeat, "summary": summary, "models": results}, indent=1))


if __name__ == "__main__":
    main()
