"""FLOPs accounting: the worked values of docs/flops.md and hand-computed model forms."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from packscope.core.flops import ModelSpec, moe_layer_pattern, packs_breakdown
from packscope.core.hf_config import HFConfigError, read_hf_config, spec_from_hf_dict

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hf"
LLAMA3_8B = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256)
PACKS = [[4096, 2048, 1024, 512, 256, 256], [3000, 2500, 1500]]


def rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize(
    "tokens,s2,expected",
    [
        (8192, 8192**2, 4.216455e14),
        (16384, 2 * 8192**2, 8.432911e14),
        (16384, 39913312, 7.691270e14),
        (15192, 39913312, 7.154537e14),
    ],
)
def test_worked_values_llama3_8b(tokens, s2, expected):
    assert rel(LLAMA3_8B.flops(tokens, s2), expected) < 5e-7


def test_tp8_pads_vocabulary():
    m = dataclasses.replace(LLAMA3_8B, tp=8)
    assert m.padded_vocab == 129024
    assert rel(m.flops(8192, 8192**2), 4.218001e14) < 5e-7


def test_packs_breakdown_matches_worked_table():
    r = packs_breakdown(LLAMA3_8B, PACKS, pack_length=8192)
    assert (r.tokens, r.real_tokens) == (16384, 15192)
    assert r.seqlen_sq_sum_bshd == 2 * 8192**2
    assert r.seqlen_sq_sum_thd == sum(s * s for p in PACKS for s in p) == 39913312
    assert r.flops_bshd >= r.flops_thd >= r.flops_useful
    assert rel(r.flops_thd, 7.691270e14) < 5e-7


def test_one_unpadded_sequence_per_pack_makes_all_three_equal():
    r = packs_breakdown(LLAMA3_8B, [[4096], [4096]])
    assert r.flops_bshd == r.flops_thd == r.flops_useful


def hand_c_lin(L, h, q, k, F, f, V, n_moe=0, Fe=0, topk=0, Fs=0, m=0, gate=False):
    """The bracket of docs/flops.md, written out once more, independently of ModelSpec."""
    Lp = L + m
    per_layer_attn = h * (q + 2 * k) + q * h + (h * q if gate else 0)
    return 6 * (
        Lp * per_layer_attn
        + h * f * F * (Lp - n_moe)
        + h * f * (Fe * topk + Fs) * n_moe
        + m * (3 * h + 2 * h * h)
        + h * V * (m + 1)
    )


def test_plain_mlp_no_gqa():
    m = ModelSpec(layers=12, hidden=768, heads=12, ffn=3072, gated=False, vocab=50257)
    V = 50304  # ceil(50257 / 128) * 128
    assert m.padded_vocab == V
    assert m.c_lin == hand_c_lin(12, 768, 768, 768, 3072, 2, V)
    assert m.c_core == 6 * 12 * 768


def test_moe_pattern_shared_experts_mtp_and_gate():
    pattern = (0, 1, 1, 1)  # first layer dense
    m = ModelSpec(
        layers=4,
        hidden=1024,
        heads=16,
        kv_heads=4,
        head_dim=64,
        ffn=4096,
        vocab=32000,
        moe_layers=pattern,
        moe_ffn=512,
        moe_topk=8,
        moe_shared_ffn=1024,
        mtp_depth=1,
        attn_output_gate=True,
    )
    # L' = 5; the MTP layer takes the type of the last decoder layer (MoE): 4 MoE layers, 1 dense
    assert m.moe_layer_count == 4
    expected = hand_c_lin(4, 1024, 1024, 256, 4096, 3, 32000, n_moe=4, Fe=512, topk=8, Fs=1024, m=1, gate=True)
    assert m.c_lin == expected
    assert m.c_core == 6 * 5 * 1024


def test_moe_layer_frequency():
    assert moe_layer_pattern(6, 2) == (1, 0, 1, 0, 1, 0)
    assert moe_layer_pattern(3, 1) == (1, 1, 1)
    m = ModelSpec(
        layers=6, hidden=256, heads=4, ffn=1024, vocab=1000, moe_layers=moe_layer_pattern(6, 3), moe_ffn=128, moe_topk=4
    )
    # Layers 0 and 3 are MoE; V_p = ceil(1000 / 128) * 128 = 1024.
    assert m.c_lin == hand_c_lin(6, 256, 256, 256, 1024, 3, 1024, n_moe=2, Fe=128, topk=4)


def test_mtp_layer_takes_dense_type_when_last_layer_dense():
    m = ModelSpec(layers=2, hidden=64, heads=4, ffn=256, vocab=128, moe_layers=(1, 0), moe_topk=2, mtp_depth=2)
    assert m.moe_layer_count == 1


@pytest.mark.parametrize("bad", [dict(layers=0), dict(heads=3), dict(moe_layers=(1, 1)), dict(moe_layers=(1,) * 4)])
def test_invalid_models_are_refused(bad):
    base = dict(layers=4, hidden=64, heads=4, ffn=128, vocab=100)
    with pytest.raises(ValueError):
        ModelSpec(**{**base, **bad})


def test_model_roundtrips_through_dict():
    m = ModelSpec(layers=2, hidden=64, heads=4, ffn=256, vocab=128, moe_layers=(1, 0), moe_topk=2)
    assert ModelSpec.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    with pytest.raises(ValueError, match="unknown model field"):
        ModelSpec.from_dict({**m.to_dict(), "bogus": 1})


# -- Hugging Face config.json ---------------------------------------------------------------


def test_hf_llama3_8b_matches_native_description():
    m = read_hf_config(FIXTURES / "llama3_8b.json")
    assert (m.c_lin, m.c_core) == (LLAMA3_8B.c_lin, LLAMA3_8B.c_core)  # 128256 divisible by 128


# Each fixture with its symbols read off by hand from docs/flops.md's table (not by the reader):
# (L, h, q = d*n, k = d*g, F, f, V_p, n_moe, F_e, topk, F_s)
HF_CASES = {
    "mistral_7b.json": (32, 4096, 4096, 1024, 14336, 3, 32000, 0, 0, 0, 0),
    "qwen2_0p5b.json": (24, 896, 896, 128, 4864, 3, 151936, 0, 0, 0, 0),
    # Qwen3 gives head_dim explicitly, and here q = 16 * 128 = 2048 differs from h = 1024.
    "qwen3_0p6b.json": (28, 1024, 2048, 1024, 3072, 3, 151936, 0, 0, 0, 0),
    "mixtral_8x7b.json": (32, 4096, 4096, 1024, 14336, 3, 32000, 32, 14336, 2, 0),
    # 6 layers, decoder_sparse_step 2 -> layers 1, 3, 5 are MoE; mlp_only_layers [3] -> 1 and 5.
    "qwen2_moe_pattern.json": (6, 2048, 2048, 2048, 5632, 3, 151936, 2, 1408, 4, 5632),
    "qwen3_moe_30b_a3b.json": (48, 2048, 4096, 512, 6144, 3, 151936, 48, 768, 8, 0),
    # GPT-2: n_inner null -> 4h, plain MLP, odd vocabulary -> divisor 1, V_p = V.
    "gpt2.json": (12, 768, 768, 768, 3072, 2, 50257, 0, 0, 0, 0),
}


@pytest.mark.parametrize("fixture", sorted(HF_CASES))
def test_hf_configs_of_every_supported_family(fixture):
    L, h, q, k, F, f, V, n_moe, Fe, topk, Fs = HF_CASES[fixture]
    m = read_hf_config(FIXTURES / fixture)
    assert m.padded_vocab == V
    assert m.c_lin == hand_c_lin(L, h, q, k, F, f, V, n_moe=n_moe, Fe=Fe, topk=topk, Fs=Fs)
    # Every layer has one attention kind; only Mistral's (sliding_window 4096) are not full.
    assert sum(m.c_core_by_kind.values()) == 6 * L * q
    assert m.c_core == (0 if fixture == "mistral_7b.json" else 6 * L * q)


def test_hf_mistral_windows_every_layer():
    m = read_hf_config(FIXTURES / "mistral_7b.json")
    assert (m.window, m.kinds) == (4096, ("sliding",) * 32)
    assert m.c_core_by_kind == {"sliding": 6 * 32 * 4096}
    with pytest.raises(ValueError, match="sliding layers"):
        m.triad(8192, 8192, 8192**2, 8192**2)  # the two-sum form would drop the window


def test_hf_qwen_moe_layer_pattern():
    m = read_hf_config(FIXTURES / "qwen2_moe_pattern.json")
    assert m.moe_layers == (0, 1, 0, 0, 0, 1)


def test_hf_reader_accepts_a_folder(tmp_path):
    (tmp_path / "config.json").write_text((FIXTURES / "gpt2.json").read_text())
    assert read_hf_config(tmp_path) == read_hf_config(FIXTURES / "gpt2.json")


def test_hf_divisor_is_largest_power_of_two_dividing_vocab():
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    }
    m = spec_from_hf_dict(cfg)
    assert m.vocab_divisor == 128 and m.padded_vocab == 151936
    odd = spec_from_hf_dict({**cfg, "vocab_size": 151655})  # odd vocab: divisor 1, V_p = V at TP=1
    assert odd.vocab_divisor == 1 and odd.padded_vocab == 151655
    assert spec_from_hf_dict({**cfg, "vocab_size": 151655}, tp=2).padded_vocab == 151656


def test_hf_unknown_architecture_is_named_and_an_absent_field_takes_transformers_default():
    with pytest.raises(HFConfigError, match="unknown model_type 'bert_xyz'"):
        spec_from_hf_dict({"model_type": "bert_xyz"})
    with pytest.raises(HFConfigError, match="model_type 'mamba' is not supported"):
        spec_from_hf_dict({"model_type": "mamba"})
    # No intermediate_size: transformers' LlamaConfig builds the model with 11008, and so do we.
    m = spec_from_hf_dict(
        {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100}
    )
    assert m.ffn == 11008


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "packscope", "flops", *args], capture_output=True, text=True)


def test_flops_cli_prints_the_three_numbers():
    packs = [arg for p in PACKS for arg in ("--pack", ",".join(map(str, p)))]
    proc = run_cli("--hf-config", str(FIXTURES / "llama3_8b.json"), *packs, "--pack-length", "8192")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["tokens"] == 16384 and out["real_tokens"] == 15192
    assert out["seqlen_sq_sum_thd"] == 39913312 and out["seqlen_sq_sum_bshd"] == 2 * 8192**2
    assert rel(out["flops_bshd"], 8.432911e14) < 5e-7
    assert rel(out["flops_useful"], 7.154537e14) < 5e-7
    # The baseline excess of the one definition, to the bit: the catalogue's formula on the two counts.
    assert out["overcount_pct"] == 100.0 * (out["flops_bshd"] / out["flops_thd"] - 1.0) > 0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--pack", "9000", "--pack-length", "8192"], "more than the pack length"),
        (["--pack", "100,-3"], "must be positive"),
        (["--pack", "1,x"], "comma-separated whole numbers"),
    ],
)
def test_flops_cli_errors_exit_2(args, message):
    proc = run_cli("--hf-config", str(FIXTURES / "llama3_8b.json"), *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_flops_cli_unreadable_config(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    proc = run_cli("--hf-config", str(bad), "--pack", "10")
    assert proc.returncode == 2 and "cannot read" in proc.stderr
