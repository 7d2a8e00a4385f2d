"""`packscope flops`: the agent's FLOPs formula as a calculator for packs of documents (and, for a
vision-language model, the images its tower sees)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from packscope.core.attention import ATTENTION_SUMS, FULL, LAYER_KINDS
from packscope.core.audio import AUDIO_TOKENS, AudioSpec
from packscope.core.audio_gemma4 import Gemma4AudioSpec
from packscope.core.catalogue import FLOAT_OPS, INT32_MAX, overcount
from packscope.core.flops import KindBreakdown, ModelSpec, packs_breakdown_by_kind
from packscope.core.hf_config import HFConfigError, UnknownModelType, load_config_json, spec_from_hf_dict
from packscope.core.vision import (
    PADDED_ROWS,
    TILES,
    VISION_SUMS,
    VISION_TOWERS,
    VisionSpec,
    batch_sums,
    decoder_tokens,
    fixed_image_sums,
    padded_rows_sums,
    pixels_to_grid,
    tiled_sums,
)

# The most tokens one document or pack may hold: attention kernels index a pack's tokens with int32
# (flash-attention's cu_seqlens), so no trainer runs a longer one.
MAX_TOKENS = INT32_MAX
# What a Hugging Face Hub model id looks like ("Qwen/Qwen3-8B"), told apart from a path that is missing.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _pack(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a pack is comma-separated whole numbers of tokens (e.g. 4096,2048), got {text!r}"
        ) from None
    if not lengths:
        raise argparse.ArgumentTypeError(f"a pack needs at least one document length (e.g. 4096,2048), got {text!r}")
    if max(lengths) > MAX_TOKENS or sum(lengths) > MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"a pack holds at most {MAX_TOKENS} tokens (2^31 - 1, what attention kernels index), got {text!r}"
        )
    return lengths


def _pack_length(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a pack length is a whole number of tokens, got {text!r}") from None
    if not 1 <= value <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"a pack length is 1..{MAX_TOKENS} tokens, got {text!r}")
    return value


def _tp(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tp is a whole number of GPUs, got {text!r}") from None


def _one_line_error(prog: str, message: str) -> NoReturn:
    """argparse's error without its usage block: one line naming what was wrong, exit 2."""
    print(f"{prog}: error: {message} (see {prog} --help)", file=sys.stderr)
    sys.exit(2)


def _integers(text: str, count: int, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} is {count} comma-separated integers, got {text!r}") from None
    if len(values) != count or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{what} is {count} comma-separated integers >= 1, got {text!r}")
    return values


def _image(text: str) -> tuple[int, ...]:
    return _integers(text, 3, "an image grid T,H,W")


def _pixels(text: str) -> tuple[int, ...]:
    return _integers(text, 2, "an image size H,W")


def _clips(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"an audio batch is comma-separated mel-frame counts, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"an audio batch's clips are mel-frame counts >= 1, got {text!r}")
    return values


def _tile_batch(text: str) -> tuple[tuple[int, int, int, int], list[int] | None, list[int] | None]:
    """ROWS,TEXT,IMAGES,TILES[/real=R,...][/attended=A,...]: one mllama micro-batch with images."""
    shape, *parts = text.split("/")
    lists: dict[str, list[int]] = {}
    try:
        dims = tuple(int(x) for x in shape.split(","))
        for part in parts:
            key, _, values = part.partition("=")
            if key not in ("real", "attended") or key in lists:
                raise ValueError
            lists[key] = [int(x) for x in values.split(",")]
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise argparse.ArgumentTypeError(
            "a tile batch is ROWS,TEXT,IMAGES,TILES (whole numbers >= 1), optionally /real=R,... (each image's real "
            f"tiles) and /attended=A,... (each text token's admitted (image, tile) entries), got {text!r}"
        )
    rows, text_tokens, images, tiles = dims
    return (rows, text_tokens, images, tiles), lists.get("real"), lists.get("attended")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a routed fraction is a number from 0 to 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a routed fraction is a number from 0 to 1, got {text!r}")
    return value


def add_flops_arguments(p: argparse.ArgumentParser) -> None:
    p.error = lambda message: _one_line_error(p.prog, message)  # type: ignore[method-assign]
    p.add_argument("--hf-config", required=True, metavar="PATH", help="a Hugging Face config.json (or its folder)")
    p.add_argument("--tp", type=_tp, default=1, help="tensor-parallel size (pads the vocabulary), default 1")
    p.add_argument(
        "--pack",
        type=_pack,
        action="append",
        required=True,
        metavar="L1,L2,...",
        help="one pack's document lengths; repeat for more packs",
    )
    p.add_argument(
        "--pack-length",
        type=_pack_length,
        default=None,
        help="token slots of every pack (default: the largest pack's total)",
    )
    images = p.add_argument_group(
        "images (a vision-language model's tower; the packs hold the decoder's tokens, the images' included)"
    )
    images.add_argument(
        "--image",
        type=_image,
        action="append",
        default=[],
        metavar="T,H,W",
        help="one image (or video) of T frames of H x W patches, as image_grid_thw gives it; repeat for more",
    )
    images.add_argument(
        "--image-pixels",
        type=_pixels,
        action="append",
        default=[],
        metavar="H,W",
        help="one image of H x W pixels, cut into the tower's patches; repeat for more",
    )
    images.add_argument(
        "--image-slots",
        type=int,
        default=None,
        metavar="S",
        help="a padded-rows tower (Gemma 4): every --image padded to S patch slots, as its processor pads to "
        "max_soft_tokens x pooling_kernel_size² (default: each image fills its own slots)",
    )
    images.add_argument(
        "--images",
        type=int,
        default=0,
        metavar="N",
        help="N images of a fixed-size tower (Gemma 3, Gemma 3n, Llava, Llama 4 tiles)",
    )
    images.add_argument(
        "--tile-batch",
        type=_tile_batch,
        action="append",
        default=[],
        metavar="ROWS,TEXT,IMAGES,TILES[/real=R,...][/attended=A,...]",
        help="a tiles tower with cross-attention (mllama): one micro-batch with images, pixel_values [ROWS, IMAGES, "
        "TILES, ...] and text [ROWS, TEXT]; real= each image's real tiles (aspect_ratio_mask.sum(-1), "
        "ROWS x IMAGES of them; default all), attended= each text token's admitted (image, tile) entries "
        "(cross_attention_mask.sum((2, 3)), ROWS x TEXT of them, 0 = none, which attends to all; default all). "
        "Repeat for more micro-batches; the packs hold the text tokens of all of them",
    )
    p.add_argument(
        "--routed-fraction",
        type=_fraction,
        default=None,
        metavar="F",
        help="a model with zero-computation experts (LongCat-Flash; required for it): the fraction of the top-k "
        "slots the router sends to real experts, the rest costing no GEMM (the agent measures it in training; "
        "1 gives the work transformers runs, which sends those slots through real experts at weight 0)",
    )
    p.add_argument_group("audio (an audio tower: Qwen3-Omni's thinker, Gemma 4, Gemma 3n)").add_argument(
        "--audio",
        type=_clips,
        action="append",
        default=[],
        metavar="F1,F2,...",
        help="one micro-batch's audio clips, in mel frames (feature_attention_mask.sum(1), Gemma 4's and Gemma 3n's "
        "input_features_mask.sum(1)); one call of the tower, which pads to the batch's longest (Qwen3-Omni: "
        "every chunk); repeat for more micro-batches. Added to every view's total, as the agent's record does",
    )


FULL_SUMS = ATTENTION_SUMS[FULL]  # the full-attention sums: every model reports them


def report(model: ModelSpec, result: KindBreakdown) -> dict[str, Any]:
    """The calculator's JSON: the three numbers, every attention sum and the FLOPs split per kind."""
    return {
        "tokens": result.tokens,
        "real_tokens": result.real_tokens,
        **{name: result.sums[name] for name in (FULL_SUMS.bshd, FULL_SUMS.thd)},
        "flops_bshd": result.flops_bshd,
        "flops_thd": result.flops_thd,
        "flops_useful": result.flops_useful,
        "c_lin": model.c_lin,
        "c_core": model.c_core,
        "padded_vocab": model.padded_vocab,
        "overcount_pct": overcount(result.flops_bshd, result.flops_thd, FLOAT_OPS),
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


def vision_sums_from_args(vision: VisionSpec | None, args: argparse.Namespace) -> dict[str, int] | None:
    """The images' sums, or None when none is given."""
    if not (args.image or args.image_pixels or args.images or args.image_slots is not None or args.tile_batch):
        return None
    if vision is None:
        raise ValueError("images were given, but the model has no vision tower (no vision_config)")
    tiles = VISION_TOWERS[vision.tower] == TILES
    if tiles != bool(args.tile_batch) or (tiles and (args.image or args.image_pixels or args.images)):
        what = "--tile-batch only" if tiles else "--image, --image-pixels or --images"
        raise ValueError(f"a {vision.tower} tower's images come as {what}")
    if tiles:
        total = dict.fromkeys(VISION_SUMS, 0)
        for dims, real, attended in args.tile_batch:
            part = tiled_sums(vision, dims, real, attended)
            total = {name: total[name] + part[name] for name in VISION_SUMS}
        return total
    if args.images < 0:
        raise ValueError(f"--images must be >= 0, got {args.images}")
    grids = [*args.image, *map_pixels(vision, args.image_pixels)]
    if args.image_slots is not None and VISION_TOWERS[vision.tower] != PADDED_ROWS:
        raise ValueError(f"--image-slots is for a padded-rows tower (Gemma 4), not a {vision.tower} tower")
    if VISION_TOWERS[vision.tower] == PADDED_ROWS:
        if any(t != 1 for t, _, _ in grids):
            raise ValueError(f"a {vision.tower} tower takes images (and video frames) one frame each: T = 1")
        sums = padded_rows_sums(vision, [(h, w) for _, h, w in grids], args.image_slots)
    else:
        sums = batch_sums(vision, grids)
    if args.images:
        fixed = fixed_image_sums(vision, args.images)
        sums = {name: sums[name] + fixed[name] for name in VISION_SUMS}
    return sums


def real_patches_from_args(vision: VisionSpec | None, args: argparse.Namespace) -> int | None:
    """A padded-rows tower's real patches (its decoder tokens' source); None for any other tower."""
    if vision is None or VISION_TOWERS[vision.tower] != PADDED_ROWS:
        return None
    return sum(h * w for _, h, w in args.image) + sum(h * w for _, h, w in map_pixels(vision, args.image_pixels))


def map_pixels(vision: VisionSpec, sizes: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    return [pixels_to_grid(vision, h, w) for h, w in sizes]


def vision_report(vision: VisionSpec, sums: dict[str, int], real_patches: int | None = None) -> dict[str, Any]:
    """The tower's term: the sums, the coefficients, and the FLOPs by term and by component. It is
    the same in all three views: a tower attends within each image, packed or not."""
    return {
        "tower": vision.tower,
        "sums": sums,
        "decoder_tokens": decoder_tokens(vision, sums, real_patches),
        "c_lin": vision.c_lin,
        "c_lin_by_component": vision.c_lin_by_component,
        "c_image": vision.c_image,
        "c_core_by_kind": vision.c_core_by_kind,
        "flops": vision.flops(sums),
        "flops_split": vision.flops_split(sums),
        "flops_by_component": vision.flops_by_component(sums),
    }


def with_vision(
    out: dict[str, Any], vision: VisionSpec, sums: dict[str, int], real_patches: int | None = None
) -> dict[str, Any]:
    """The decoder's report with the tower's term added to each view's total and split."""
    return _with_tower(out, "vision", vision_report(vision, sums, real_patches))


def audio_report(audio: AudioSpec | Gemma4AudioSpec, calls: list[tuple[int, ...]]) -> dict[str, Any]:
    """The audio tower's sums and FLOPs for these micro-batches."""
    sums = audio.batch_sums(calls)
    return {
        "tower": audio.tower,
        "sums": sums,
        "decoder_tokens": sums[AUDIO_TOKENS],
        "c_by_sum": audio.c_by_sum,
        "flops": audio.flops(sums),
        "flops_by_component": audio.flops_by_component(sums),
        "in_totals": True,  # the record carries the audio sums: the agent and the server add it too
    }


def with_audio(out: dict[str, Any], audio: AudioSpec | Gemma4AudioSpec, calls: list[tuple[int, ...]]) -> dict[str, Any]:
    """The report with the audio tower's term added to each view's total and split."""
    return _with_tower(out, "audio", audio_report(audio, calls))


def _with_tower(out: dict[str, Any], name: str, part: dict[str, Any]) -> dict[str, Any]:
    """A tower's report under `name`, its FLOPs added to every view's total and split (a tower
    attends within its own inputs: the same work whether the decoder's rows are packed or not)."""
    for view in ("bshd", "thd", "useful"):
        out[f"flops_{view}"] += part["flops"]
        out["flops_split"][view][name] = part["flops"]
    out["overcount_pct"] = overcount(out["flops_bshd"], out["flops_thd"], FLOAT_OPS)
    out[name] = part
    return out


def hub_id_hint(path: str) -> str | None:
    """How to fetch config.json when `path` is no file but looks like a Hub model id (no network here)."""
    if Path(path).exists() or not HUB_ID.fullmatch(path):
        return None
    name = path.split("/")[1]
    return (
        f"--hf-config takes a local config.json, and {path!r} is no file or folder here; if it is a Hugging "
        f"Face Hub model id, fetch its config first: `hf download {path} config.json --local-dir {name}` "
        f"(older huggingface_hub: `huggingface-cli download ...`) or "
        f"https://huggingface.co/{path}/resolve/main/config.json, then pass --hf-config {name}/config.json"
    )


def vocab_padding_notice(model: ModelSpec) -> str | None:
    """One line when the count pads the vocabulary (Megatron-style, for tensor parallelism)."""
    if model.padded_vocab == model.vocab:
        return None
    step, added = model.vocab_divisor * model.tp, model.padded_vocab - model.vocab
    return (
        f"note: the logits count a vocabulary of {model.padded_vocab}, not {model.vocab} (+{added}): "
        f"padded Megatron-style to a multiple of {step} (divisor {model.vocab_divisor} x --tp {model.tp})"
    )


def read_model(path: str, tp: int) -> ModelSpec:
    """The hand-written reader where there is one; else the count from the model's own structure,
    which needs transformers (and torch): without them, an error saying to install them."""
    cfg = load_config_json(path)
    try:
        return spec_from_hf_dict(cfg, tp=tp)
    except UnknownModelType as exc:
        try:
            from packscope.agent.hf_structure import spec_from_structure
        except ImportError:
            raise HFConfigError(
                f"{exc}; to count it from the model's own structure, install transformers and torch "
                "(pip install transformers torch)"
            ) from None
        return spec_from_structure(cfg, tp=tp)


def with_routing(model: ModelSpec, fraction: float | None) -> ModelSpec:
    """The model with its routed work fixed by ``--routed-fraction``: required for a model with
    zero-computation experts (its routed work depends on the routing), refused for any other."""
    if fraction is not None:
        return model.with_routed_fraction(fraction)
    if model.routing_dependent:
        raise ValueError(
            f"{model.name or 'this model'} routes tokens to zero-computation experts, so its routed experts' work "
            "depends on the routing: give --routed-fraction F, the fraction of the top-k slots that go to real "
            "experts (0 to 1; the agent measures it in training)"
        )
    return model


def flops_from_args(args: argparse.Namespace) -> int:
    try:
        if args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        hint = hub_id_hint(args.hf_config)
        if hint is not None:
            raise ValueError(hint)
        model = with_routing(read_model(args.hf_config, tp=args.tp), args.routed_fraction)
        result = packs_breakdown_by_kind(model, args.pack, args.pack_length)
        sums = vision_sums_from_args(model.vision, args)
        if args.audio and model.audio is None:
            raise ValueError("audio clips were given, but the model has no audio tower packscope counts")
    except (HFConfigError, ValueError) as exc:
        print(f"packscope flops: error: {exc}", file=sys.stderr)
        return 2
    notice = vocab_padding_notice(model)
    if notice is not None:
        print(f"packscope flops: {notice}", file=sys.stderr)
    out = report(model, result)
    if sums is not None and model.vision is not None:
        out = with_vision(out, model.vision, sums, real_patches_from_args(model.vision, args))
    if args.audio and model.audio is not None:
        out = with_audio(out, model.audio, args.audio)
    print(json.dumps(out, indent=2))
    return 0


__all__ = [
    "add_flops_arguments",
    "audio_report",
    "flops_from_args",
    "read_model",
    "report",
    "vision_report",
    "with_audio",
    "with_vision",
]
