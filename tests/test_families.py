"""Every checkpoint family known or refused, never misread (issue 20): a sweep over the architectures
``transformers`` builds from a tiny config.

For each text model type in transformers' auto mappings (causal LM and masked LM), a tiny random model
(4 layers, width 64, 4 heads, 2 KV heads where the family has them, sliding and full layers where it
has them) is built with a fixed seed, its weights drawn so that a dropped bias, norm weight or
multiplier shows (std 1.5/sqrt(fan_in), norm weights 1 + 0.5·U(-1, 1), biases nonzero), saved with
``save_pretrained`` (safetensors), and run once with hooks on each tested layer's attention module
(its input, its per-head weights, its output projection's output) and ``output_hidden_states``.
Then ``attncli self X.npy --weights FOLDER --layer N --format json``, from the module's input and with
``--from-residual`` from ``hidden_states[N]``, for a sliding and a full layer where they differ.

The reference is the model's own attention module (transformers, eager attention). Each family must
either AGREE (per-head weights and output within 1e-5, float32) or EXIT 2 with one line; exit 0 with
other numbers fails. The verdict is pinned: docs/families.md's results table is the expectation (an agreeing
family must agree, a refused one be refused; a change fails with both reasons), and a family is skipped only
where that table skips it for the same reason (a key of SKIP_REASON); any other failure of the harness fails.
The config variants of families (``VARIANTS``: falcon-alibi, opt-post-norm, modernbert-yarn, ...) are pinned the
same way by the "## Variants" and "## Variants in bfloat16" tables, a refused variant also for its reason.
``SILENT`` lists the families that are silently wrong today, each with its cause,
as ``xfail(strict=True)``: when one is fixed its test passes, the xfail fails, and the entry must go.

``ATTNCLI_SWEEP_SEED=N`` draws other weights (acceptance-style fresh runs); ``ATTNCLI_SWEEP_ONLY=a,b``
restricts the sweep. ``python tests/test_families.py`` prints the table (docs/families.md); a name of
``VARIANTS`` (``opt-post-norm``) prints that variant's row, ``--variants`` every variant's (docs/families_md.py).
Models whose layers share one attention module (ALBERT) are hooked per call: call N of the shared modules is
layer N, ``hidden_states[N]`` its input.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SEED = int(os.environ.get("ATTNCLI_SWEEP_SEED", "0"))
TOL = 1e-5
T = 10  # tokens: longer than the sliding window (3) and the chunk (4) below
WIDTH, HEADS, KV, LAYERS = 64, 4, 2, 4

# ---- which architectures ---------------------------------------------------------------------------

# Config keys set when the family's config has them (attribute_map aliases included: n_embd, n_head, ...).
TINY: dict[str, Any] = dict(
    hidden_size=WIDTH, num_attention_heads=HEADS, num_key_value_heads=KV, num_hidden_layers=LAYERS,
    intermediate_size=64, ffn_hidden_size=64, ffn_dim=64, encoder_ffn_dim=64, decoder_ffn_dim=64,
    vocab_size=64, max_position_embeddings=64, n_positions=64, n_ctx=64, type_vocab_size=2,
    sliding_window=3, attention_chunk_size=4, window_size=3,
    num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, n_shared_experts=1, moe_topk=2,
    decoder_layers=LAYERS, decoder_attention_heads=HEADS, encoder_layers=LAYERS, encoder_attention_heads=HEADS,
    d_model=WIDTH, embedding_size=WIDTH, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
MLA = dict(kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
           num_key_value_heads=HEADS, n_group=1, topk_group=1)
# Per family: what TINY cannot say (multi-query vs per-head, window on, the layer pattern).
OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen2": dict(use_sliding_window=True, max_window_layers=2),
    "qwen3": dict(use_sliding_window=True, max_window_layers=2),
    "gpt_bigcode": dict(multi_query=False),
    "gpt_neo": dict(attention_types=[[["global", "local"], 2]], window_size=3),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=KV),
    "granite": dict(attention_multiplier=0.3),
    "granitemoe": dict(attention_multiplier=0.3),
    "granitemoeshared": dict(attention_multiplier=0.3),
    "olmo": dict(clip_qkv=0.5),
    # Llama 4: layers 0-2 RoPE + chunked (chunk 4 < T), layer 3 NoPE + full with the temperature tuning, whose
    # factor log(floor((pos + 1) / floor_scale) + 1) · attn_scale + 1 is 1 for every pos < floor_scale - 1 at the
    # default 8192: floor_scale 2 makes it vary over the 10 tokens. use_qk_norm (HF's default, True): the L2 norm
    # of q and k after RoPE on the RoPE layers; the variant llama4_text-no-qk-norm turns it off.
    "llama4_text": dict(no_rope_layers=[1, 1, 1, 0], attn_temperature_tuning=True, floor_scale=2, attn_scale=0.5,
                        use_qk_norm=True),
    "stablelm": dict(qk_layernorm=True, partial_rotary_factor=0.5, use_qkv_bias=True),
    "phi": dict(qk_layernorm=True, partial_rotary_factor=0.5),
    "persimmon": dict(qk_layernorm=True, partial_rotary_factor=0.5),
    "cohere": dict(use_qk_norm=True),
    # Laguna: sliding and full layers (rotary per type: partial on the full ones), its default per-head gate
    # Granite SWA: layer 0 sliding and NoPE (theta 0), layer 1 full with its own base, sinks (random), the multiplier
    **{mt: dict(attention_multiplier=0.3, layer_types=["sliding_attention", "full_attention"] * 2,
                layer_rope_theta=[0, 50000.0, 10000.0, 0]) for mt in ("granite_swa", "granitemoe_swa")},
    "laguna": dict(layer_types=["sliding_attention", "full_attention"] * 2, gating=True),
    # LFM3: a sliding layer (default rotary: agrees) besides its conv layers and a full one (proportional rotary)
    "lfm3": dict(layer_types=["sliding_attention", "conv", "full_attention", "sliding_attention"]),
    "gptj": dict(rotary_dim=8),
    "codegen": dict(rotary_dim=8),
    **{mt: dict(MLA) for mt in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "minicpm3", "glm4_moe_lite", "glm_moe_dsa",
                                "youtu", "axk1", "axk2")},
}
# Model types not swept, and why (checked against the registry so the list cannot rot silently).
SKIP_REASON = {
    "composite": "a multimodal/composite config (text_config, vision_config or audio): not a text stack",
    "no-attention": "no self-attention module in its layers (recurrent / state-space / convolution / FNet)",
    "build": "transformers does not build or run it from the tiny config",
}


def _mappings() -> tuple[dict[str, str], dict[str, str]]:
    from transformers.models.auto import modeling_auto as ma

    causal = dict(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    masked = {k: v for k, v in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES.items() if k not in causal}
    return causal, masked


def model_types() -> list[str]:
    causal, masked = _mappings()
    names = sorted({*causal, *masked})
    only = os.environ.get("ATTNCLI_SWEEP_ONLY")
    if only:
        names = [n for n in names if n in only.split(",")]
    return names


# ---- building one tiny model -----------------------------------------------------------------------

def _config(mt: str, seed: int) -> Any:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[mt]
    default = cls()
    if any(getattr(default, k, None) is not None for k in ("text_config", "vision_config", "audio_config",
                                                            "encoder_config", "vq_config")):
        raise Skip("composite")
    kw = {k: v for k, v in TINY.items() if hasattr(default, k)}
    kw.update(OVERRIDES.get(mt, {}))
    if hasattr(default, "head_dim") and not isinstance(getattr(cls, "head_dim", None), property) \
            and "head_dim" not in kw:
        kw["head_dim"] = WIDTH // HEADS
    cfg = cls(**kw)
    for k in ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "hidden_dropout_prob", "dropout",
              "resid_pdrop", "embd_pdrop", "hidden_dropout", "attention_dropout_prob"):
        if isinstance(getattr(cfg, k, None), float):
            setattr(cfg, k, 0.0)
    return cfg


class Skip(Exception):
    def __init__(self, why: str, detail: str = "") -> None:
        super().__init__(why)
        self.why, self.detail = why, detail


def _randomise(model: Any, seed: int) -> None:
    """Weights large enough that a dropped bias, norm weight or multiplier shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            parent = name.rsplit(".", 2)[-2] if name.count(".") else ""
            if not p.is_floating_point():
                continue
            normish = any(s in parent.lower() for s in ("norm", "ln", "layernorm"))
            if leaf == "bias" or name.endswith("_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.ndim == 1 and normish:
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            elif p.ndim >= 2 and "embed" in name.lower() or "wte" in name or "wpe" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / fan_in ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        for m in model.modules():  # RoFormer's rotary table is a weight: real checkpoints hold the sinusoidal one
            if type(m).__name__ == "RoFormerSinusoidalPositionalEmbedding":
                m.weight.copy_(m.create_weight())


def _layers(model: Any, n: int) -> Any:
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n:
            return m
    raise Skip("no-attention", "no module list of num_hidden_layers layers")


SHARED = ("albert",)  # one attention module per group, called by several layers: each call is a layer


def _shared(model: Any) -> list[tuple[Any, Any]]:
    """The attention modules of a model whose layers share them (ALBERT's albert_layer_groups)."""
    found = _attention(model)
    if found is None:
        raise Skip("no-attention", "no *Attention module with an output projection")
    mods = []
    for name, m in model.named_modules():
        if name and name.split(".")[-1] in ATTN_NAMES and "Attention" in type(m).__name__:
            outs = [s for n, s in m.named_modules() if n and n.split(".")[-1] in OUT_NAMES]
            if outs:
                mods.append((m, outs[-1]))
    return mods


ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention", "SelfAttention", "mixer", "attn_layer",
              "multi_head_attention")  # CTRL's EncoderLayer
OUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "o", "wo", "Wo", "out_lin", "proj", "out", "o_dense",
             "output_proj", "linear_out")


def _attention(layer: Any) -> tuple[Any, Any] | None:
    """The layer's self-attention module and its output projection (None if the layer has no attention). XLM and
    FlauBERT keep their attention modules in a list of their own (``attentions``): the "layer" is the module."""
    for name, m in layer.named_modules():
        if "cross" in name.lower() or "encoder_attn" in name:
            continue
        if (name.split(".")[-1] in ATTN_NAMES or not name) and "Attention" in type(m).__name__:
            outs = [(n, s) for n, s in m.named_modules()
                    if n and n.split(".")[-1] in OUT_NAMES and getattr(s, "weight", None) is not None
                    and s.weight.ndim == 2]
            if outs:
                return m, outs[-1][1]
    return None


def _x_module(attn: Any) -> Any:
    """The module whose input is X, the query projection's input (issue 30: X means one thing for every family): the
    attention module, or its query projection where a norm sits inside it, before ``self`` (pre-LN BERTs, ESM)."""
    inside = any(n in ("LayerNorm", "self_attn_layer_norm", "ln") for n, _ in attn.named_children())
    query = getattr(getattr(attn, "self", None), "query", None)
    return query if inside and query is not None else attn


@dataclass
class Built:
    folder: Path
    layers: dict[int, dict[str, np.ndarray]]  # layer -> x, weights, y, hidden
    model_type: str
    kinds: dict[int, str] = field(default_factory=dict)


def _tested_layers(cfg: Any, attn_layers: list[int]) -> dict[int, str]:
    """A layer of each kind (sliding / full / chunked / NoPE ...) where the family has kinds, else the last."""
    picks: dict[str, int] = {}
    types = getattr(cfg, "layer_types", None)
    for i in attn_layers:
        kind = str(types[i]) if isinstance(types, list | tuple) and i < len(types) else "attention"
        nope = getattr(cfg, "no_rope_layers", None)
        if isinstance(nope, list | tuple) and i < len(nope):
            kind += "/rope" if nope[i] else "/nope"
        atypes = getattr(cfg, "attention_layers", None)  # GPT-Neo
        if isinstance(atypes, list | tuple) and i < len(atypes):
            kind = str(atypes[i])
        picks.setdefault(kind, i)
    if len(picks) == 1:
        return {attn_layers[-1]: next(iter(picks))}
    return {i: k for k, i in picks.items()}


def _plain_mask(m: Any, args: Any, kw: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Falcon with ALiBi: FalconModel folds alibi / sqrt(d) into the mask it hands every layer, and the eager
    FalconAttention (the path output_attentions takes) adds alibi again before scaling, so the eager model adds
    it twice while its SDPA path (the default) and Falcon-RW's own code add it once. The reference is the module
    on the plain causal mask: (q·k + alibi) / sqrt(d), once."""
    mask = kw.get("attention_mask")
    if mask is not None and mask.is_floating_point():
        low = torch.finfo(mask.dtype).min
        kw = dict(kw, attention_mask=torch.where(mask <= low / 2, torch.full((), low, dtype=mask.dtype),
                                                 torch.zeros((), dtype=mask.dtype)))
    return args, kw


def tiny_model(mt: str, seed: int = SEED) -> tuple[Any, Any]:
    """The family's tiny model (eager attention, eval mode) with the sweep's random weights, and its config; Skip
    where transformers does not build it."""
    causal, _ = _mappings()
    try:
        cfg = _config(mt, seed)
    except Skip:
        raise
    except Exception as e:  # noqa: BLE001 - a config transformers itself refuses
        raise Skip("build", f"config: {type(e).__name__}: {str(e)[:120]}") from e
    auto = transformers.AutoModelForCausalLM if mt in causal else transformers.AutoModelForMaskedLM
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = auto.from_config(cfg, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001
        raise Skip("build", f"model: {type(e).__name__}: {str(e)[:120]}") from e
    model.eval()
    _randomise(model, seed)
    return model, cfg


def _tensor(res: Any) -> Any:
    """A module's output tensor: I-BERT's QuantLinear returns (output, its scaling factor)."""
    return res[0] if isinstance(res, tuple) else res


def build(mt: str, folder: Path, seed: int = SEED, dtype: Any = None) -> Built:
    model, cfg = tiny_model(mt, seed)
    n = getattr(cfg, "num_hidden_layers", LAYERS)
    if mt in SHARED:  # hooked per call below: call c of the shared modules is layer c (hidden_states[c] its input)
        shared, found, tested = _shared(model), {}, {}
    else:
        shared, stack = None, _layers(model, n)
        found = {i: a for i, layer in enumerate(stack) if (a := _attention(layer)) is not None}
        if not found:
            raise Skip("no-attention", "no *Attention module with an output projection in its layers")
        tested = _tested_layers(cfg, sorted(found))
    if dtype is None:
        model.save_pretrained(folder)
    else:  # the reference: the same weights rounded to dtype, computed in float32 (rotary buffers stay float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith("embed_positions.weight") or mt != "roformer":  # its sinusoidal table: as the
                    p.copy_(p.to(dtype).float())  # rotary buffers, exact (attncli checks the stored one, computes it)
        copy.deepcopy(model).to(dtype).save_pretrained(folder)
    got: dict[int, dict[str, Any]] = {i: {} for i in tested}
    handles = []
    if mt == "falcon" and getattr(cfg, "alibi", False):  # see _plain_mask
        handles += [a.register_forward_pre_hook(_plain_mask, with_kwargs=True) for a, _ in found.values()]
    calls: list[dict[str, Any]] = []  # shared modules: one entry per call, in call order
    for attn, out in shared or []:
        def pre_c(m: Any, args: Any, kw: Any) -> None:
            calls.append({"x": (args[0] if args else kw["hidden_states"]).detach()})

        def post_c(m: Any, args: Any, res: Any) -> None:
            if isinstance(res, tuple) and len(res) > 1 and isinstance(res[1], torch.Tensor) and res[1].ndim == 4:
                calls[-1].setdefault("weights", res[1].detach())

        def proj_c(m: Any, args: Any, res: Any) -> None:
            calls[-1].setdefault("y", _tensor(res).detach())

        handles += [attn.register_forward_pre_hook(pre_c, with_kwargs=True), attn.register_forward_hook(post_c),
                    out.register_forward_hook(proj_c)]
    for i in tested:
        attn, out = found[i]

        def pre(m: Any, args: Any, kw: Any, g: dict[str, Any] = got[i]) -> None:
            g.setdefault("x", (args[0] if args else kw["hidden_states"]).detach())

        def post(m: Any, args: Any, res: Any, g: dict[str, Any] = got[i]) -> None:
            if isinstance(res, tuple) and len(res) > 1 and isinstance(res[1], torch.Tensor) and res[1].ndim == 4:
                g.setdefault("weights", res[1].detach())

        def proj(m: Any, args: Any, res: Any, g: dict[str, Any] = got[i]) -> None:
            g.setdefault("y", _tensor(res).detach())

        handles += [_x_module(attn).register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post),
                    out.register_forward_hook(proj)]
    ids = (torch.arange(T) * 7 + 3).remainder(60)[None] + 3
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    except Exception as e:  # noqa: BLE001
        raise Skip("build", f"forward: {type(e).__name__}: {str(e)[:120]}") from e
    finally:
        for h in handles:
            h.remove()
    hidden = getattr(res, "hidden_states", None)
    if shared:  # call 2 and the last (ALBERT with 2 groups of 2: group 0 inner layer 0, group 1 inner layer 1); call
        # 0 takes the embeddings' projection (|x| ~ 20: softmax weights of 1 - 1e-8, float32's rounding shows at 6e-6)
        tested = {i: f"call {i}" for i in sorted({min(2, len(calls) - 1), len(calls) - 1})}
        got = {i: calls[i] for i in tested}
    layers: dict[int, dict[str, np.ndarray]] = {}
    for i, g in got.items():
        if "weights" not in g and getattr(res, "attentions", None) is not None and i < len(res.attentions):
            g["weights"] = res.attentions[i]
        if not {"x", "y"} <= set(g):
            raise Skip("build", f"layer {i}: the hooks did not see {sorted({'x', 'y'} - set(g))}")
        # a module that returns no weights (MRA's approximation): the output alone is compared
        arrays = {k: g[k][0].double().numpy() for k in ("x", "y", "weights") if k in g}
        if hidden is not None and i < len(hidden):
            arrays["hidden"] = hidden[i][0].double().numpy()
        layers[i] = arrays
    return Built(folder, layers, mt, tested)


# ---- running attncli and judging it -----------------------------------------------------------------

runner = CliRunner()


@dataclass
class Outcome:
    verdict: str  # "agrees" | "refused" | "wrong" | "broken"
    detail: str
    error: float = 0.0


# Granite SWA: output · sigmoid(lse - sink) after softmax · V, i.e. a sink logit in the denominator. attncli's weights
# are those multiplying V (rows summing to 1 - the sink's share); HF's output_attentions the plain softmax before it.
# Their rows renormalised must equal HF's, and the output (which the sink's share scales) must agree as it is.
SINK_SCALED = ("granite_swa", "granitemoe_swa")


def run_self(built: Built, layer: int, residual: bool, work: Path) -> Outcome:
    arrays = built.layers[layer]
    src = arrays["hidden"] if residual else arrays["x"]
    path = work / f"{'h' if residual else 'x'}{layer}.npy"
    np.save(path, src.astype(np.float32))
    args = ["self", str(path), "--weights", str(built.folder), "--layer", str(layer), "--format", "json"]
    if residual:
        args.append("--from-residual")
    res = runner.invoke(app, args)
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        if len(lines) != 1:
            return Outcome("broken", f"exit 2 with {len(lines)} lines: {res.stderr[:200]!r}")
        return Outcome("refused", lines[0])
    if res.exit_code != 0:
        return Outcome("broken", f"exit {res.exit_code}: {(res.stderr or res.output)[-300:]!r}")
    doc = json.loads(res.stdout)
    w, y = np.array(doc["weights"], dtype=np.float64), np.array(doc["output"], dtype=np.float64)
    if built.model_type in SINK_SCALED:  # HF returns the weights before the sink's share: attncli's, renormalised
        w = w / np.where(w.sum(axis=-1, keepdims=True) > 0, w.sum(axis=-1, keepdims=True), 1.0)
    want_w = arrays.get("weights", w)  # a module without weights: the output alone decides
    if w.shape != want_w.shape or y.shape != arrays["y"].shape:
        return Outcome("wrong", f"shapes {w.shape} {y.shape}, the module's {want_w.shape} "
                                f"{arrays['y'].shape}", float("inf"))
    scale = max(1.0, float(np.abs(arrays["y"]).max()))  # float32's rounding grows with the output's size
    ew = float(np.abs(w - want_w).max())
    err = max(ew, float(np.abs(y - arrays["y"]).max()) / scale)
    if not np.isfinite(err) or err > TOL:
        return Outcome("wrong", f"weights off by {ew:.2g}, output by {float(np.abs(y - arrays['y']).max()):.2g}", err)
    return Outcome("agrees", f"{err:.1e}" + ("" if "weights" in arrays else " (output only: no weights)"), err)


def sweep_one(mt: str, dtype: Any = None, seed: int = SEED) -> dict[str, Outcome]:
    """Every run of one family: '{layer}/{kind}' and '{layer}/{kind} --from-residual' -> its outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        built = build(mt, work / "model", seed, dtype)
        out: dict[str, Outcome] = {}
        for layer, kind in built.kinds.items():
            out[f"{layer}/{kind}"] = run_self(built, layer, False, work)
            if "hidden" in built.layers[layer]:
                out[f"{layer}/{kind} --from-residual"] = run_self(built, layer, True, work)
        return out


def summary(outcomes: dict[str, Outcome]) -> tuple[str, str]:
    """One verdict for the family: broken > wrong > refused (all) > agrees; with the detail."""
    for v in ("broken", "wrong"):
        bad = {k: o for k, o in outcomes.items() if o.verdict == v}
        if bad:
            return v, "; ".join(f"{k}: {o.detail}" for k, o in bad.items())
    if all(o.verdict == "refused" for o in outcomes.values()):
        return "refused", next(iter(outcomes.values())).detail
    if any(o.verdict == "refused" for o in outcomes.values()):
        ok = [k for k, o in outcomes.items() if o.verdict == "agrees"]
        no = {k: o.detail for k, o in outcomes.items() if o.verdict == "refused"}
        return "partly refused", f"agrees on {', '.join(ok)}; refuses {no}"
    return "agrees", f"{max(o.error for o in outcomes.values()):.1e}"


# ---- the expectations ----------------------------------------------------------------------------

# Silently wrong today (exit 0, other numbers), with the cause read from the family's *Attention.forward.
# (phase A listed 46 families here; each is now declared and agrees, or is refused in one line: docs/families.md)
SILENT: dict[str, str] = {}

DOC = Path(__file__).resolve().parent.parent / "docs" / "families.md"


def documented(section: str) -> dict[str, tuple[str, str]]:
    """The expectation: docs/families.md's table under ``section`` ("## Results", "## bfloat16", "## Variants",
    "## Variants in bfloat16"), model type or variant -> (verdict, detail). A skipped family's detail starts with
    its reason, a key of SKIP_REASON."""
    doc = DOC.read_text()
    if section not in doc:
        return {}  # each row's test fails, naming the command that prints its row
    start = doc.index(section)  # "## Variants" comes before "## Variants in bfloat16"
    table = doc[start:doc.index("\n## ", start + 1)]
    rows = re.findall(r"^\| ([^ |]+) \| ([a-z ]+) \| (.*) \|$", table, flags=re.M)
    return {name: (verdict, detail) for name, verdict, detail in rows if verdict != "verdict"}


def shown(detail: str) -> str:
    """A row's detail as docs/families.md writes it: the temporary model folder as FOLDER, one line, ``|``
    escaped, at most 240 characters (docs/families_md.py writes the rows main() prints)."""
    detail = re.sub(r"(attncli: error: )?/tmp/[^/ ]+/model", "FOLDER", detail.replace("\n", " "))
    return detail.replace("|", "\\|")[:240]


EXPECTED, EXPECTED_BF16 = documented("## Results"), documented("## bfloat16")
EXPECTED_VARIANTS, EXPECTED_VARIANTS_BF16 = documented("## Variants"), documented("## Variants in bfloat16")


def _ids() -> Iterator[Any]:
    for mt in model_types():
        marks = []
        if mt in SILENT:
            marks.append(pytest.mark.xfail(reason=SILENT[mt], strict=True))
        yield pytest.param(mt, id=mt, marks=marks)


def as_documented(mt: str, label: str, expected: dict[str, tuple[str, str]], dtype: Any = None,
                  row: str | None = None) -> str:
    """The family's verdict is docs/families.md's (an agreeing family agrees, a refused one is refused): a change
    fails with both reasons. A skip is allowed only where the table skips the family for the same reason (a key
    of SKIP_REASON); any other failure of the harness fails. ``row``: the table's row when it is not ``mt``'s
    (a variant of the family, its config in OVERRIDES). Returns the run's detail."""
    row = row or mt
    if row not in expected:
        pytest.fail(f"{label}: not in docs/families.md; `python tests/test_families.py {row}` prints its row")
    want, why = expected[row]
    try:
        outcomes = sweep_one(mt, dtype)
    except Skip as e:
        if want == "skipped" and why.split(":")[0] == e.why and e.why in SKIP_REASON:
            pytest.skip(f"{SKIP_REASON[e.why]}: {e.detail}")
        pytest.fail(f"{label}: the harness failed ({e.why}: {e.detail}); docs/families.md says {want}: {why}")
    verdict, detail = summary(outcomes)
    assert verdict not in ("wrong", "broken"), f"{label}: {verdict}: {detail}"
    assert verdict == want, f"{label}: {verdict} ({detail}); docs/families.md says {want} ({why})"
    return detail


def variant_as_documented(name: str, label: str, expected: dict[str, tuple[str, str]], dtype: Any = None) -> None:
    """A variant's verdict is its row in docs/families.md's "## Variants" table (or its bfloat16 table): an
    agreeing variant agrees; a refused one is refused, for the reason the table names (a config key or tensor of
    FOLDER, never a harness failure: a variant transformers cannot build fails)."""
    mt, over = VARIANTS[name]
    saved = OVERRIDES.get(mt)
    OVERRIDES[mt] = over
    try:
        detail = as_documented(mt, label, expected, dtype, row=name)
        want, why = expected[name]
        assert want in ("agrees", "refused", "partly refused"), f"{label}: docs/families.md says {want} ({why})"
        if want == "refused":  # the same reason, not only the same verdict
            assert shown(detail) == why, f"{label}: refused ({shown(detail)}); docs/families.md says refused ({why})"
    finally:
        OVERRIDES.pop(mt)
        if saved is not None:
            OVERRIDES[mt] = saved


@pytest.mark.slow
@pytest.mark.parametrize("mt", list(_ids()))
def test_family_verdict_is_the_documented_one(mt: str) -> None:
    as_documented(mt, mt, EXPECTED)


# Families whose every run must agree (not only agree or refuse): each new step, against its own module.
MUST_AGREE = ["olmo", "bitnet", "llama4_text", "roformer", "esm", "afmoe", "laguna", "granite_swa", "granitemoe_swa",
              "olmoe", "minimax_m2", "qwen3_next", "qwen3_5_text"]


@pytest.mark.slow
@pytest.mark.parametrize("mt", MUST_AGREE)
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_family_with_a_new_step_agrees(mt: str, dtype: str | None) -> None:
    """OLMo's clamp, BitNet's sub-norm, Llama 4's chunked RoPE layers and tuned NoPE layers, in float32 and from a
    bfloat16 checkpoint, plain and --from-residual."""
    outcomes = sweep_one(mt, None if dtype is None else getattr(torch, dtype))
    assert {o.verdict for o in outcomes.values()} == {"agrees"}, outcomes
    if mt in ("afmoe", "laguna", "granite_swa"):  # a sliding and a full layer were both run
        assert {k.split(" ")[0].split("/")[1] for k in outcomes} == {"sliding_attention", "full_attention"}
    if mt == "llama4_text":  # a chunked RoPE layer and a NoPE layer with the tuning were both run
        assert {k.split(" ")[0] for k in outcomes} == {"0/chunked_attention/rope", "3/full_attention/nope"}


@pytest.mark.parametrize("mt", ["qwen2_moe", "qwen3_moe", "qwen2", "qwen3"])
def test_a_window_kept_beside_use_sliding_window_false_is_not_applied(mt: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub's Qwen1.5-MoE / Qwen2.5 config.json files keep sliding_window (32768, 131072) beside
    use_sliding_window: false; transformers' configs drop it (None, or 0 for Qwen2-MoE): no layer slides. Here a window
    of 3 keys (T = 10) is written back into the saved config.json: every run agrees with the module, which attended
    to every key (attncli slid Qwen2-MoE's and Qwen3-MoE's layers before: weights off by 0.98 and 0.47, exit 0)."""
    monkeypatch.setitem(OVERRIDES, mt, {**OVERRIDES.get(mt, {}), "use_sliding_window": False, "sliding_window": 3})
    built = build(mt, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["sliding_window"] = 3
    cfg.pop("layer_types", None)
    path.write_text(json.dumps(cfg))
    outcomes = {layer: run_self(built, layer, False, tmp_path) for layer in built.kinds}
    assert outcomes and {o.verdict for o in outcomes.values()} == {"agrees"}, outcomes


def test_window_defaults_are_the_config_classes() -> None:
    """A config.json without its window keys is read as transformers reads it (attncli.io.class_defaults): every
    declared family whose class has a window by default gets that window, and the families whose class drops the
    window unless use_sliding_window (Qwen 2/3 (MoE), SmolLM3) get use_sliding_window false and no window."""
    from transformers import CONFIG_MAPPING

    from attncli.io.class_defaults import DEFAULTS
    from attncli.io.families import FAMILIES

    windows, switched = {}, []
    for mt, fam in FAMILIES.items():
        if fam.window_key != "sliding_window" or fam.window_key not in fam.reads() or mt not in CONFIG_MAPPING \
                or fam.layer_type is not None:
            continue
        cfg = CONFIG_MAPPING[mt]()
        if getattr(cfg, "use_sliding_window", None) is False:
            switched.append(mt)
            assert DEFAULTS[mt]["use_sliding_window"] is False and "sliding_window" not in DEFAULTS[mt], mt
        elif getattr(cfg, "sliding_window", None) is not None:
            windows[mt] = cfg.sliding_window
            assert DEFAULTS[mt]["sliding_window"] == cfg.sliding_window, mt
    assert windows["mistral"] == 4096 and windows["gpt_oss"] == 128 and len(windows) >= 20
    assert {"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3"} <= set(switched)


@pytest.mark.parametrize("mt", ["gpt_oss", "granite_swa"])
def test_a_config_without_its_window_key_has_the_classs_window(mt: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss and Granite SWA (a default window of 128) at T = 140 with config.json's sliding_window deleted: the
    module (built with the class's 128) and attncli agree; attncli attended to every key before (no window read)."""
    monkeypatch.setattr(sys.modules[__name__], "T", 140)
    monkeypatch.setitem(OVERRIDES, mt, {**OVERRIDES.get(mt, {}), "sliding_window": 128, "max_position_embeddings": 256})
    built = build(mt, tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    cfg = json.loads(path.read_text())
    del cfg["sliding_window"]
    path.write_text(json.dumps(cfg))
    outcomes = {layer: run_self(built, layer, False, tmp_path) for layer in built.kinds}
    assert any("sliding" in kind for kind in built.kinds.values()), built.kinds
    assert outcomes and {o.verdict for o in outcomes.values()} == {"agrees"}, outcomes


@pytest.mark.slow
def test_hybrid_layer_refused_naming_its_type(tmp_path: Path) -> None:
    """Qwen3-Next's linear_attention layers (Gated DeltaNet) have no softmax attention: --layer on one is refused in
    one line naming its layer type; its full_attention layer (3) agrees with the module (as the sweep checks)."""
    built = build("qwen3_next", tmp_path / "m")
    assert sorted(built.layers) == [3]
    path = tmp_path / "x.npy"
    np.save(path, built.layers[3]["x"].astype(np.float32))
    res = runner.invoke(app, ["self", str(path), "--weights", str(built.folder), "--layer", "0"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--layer" in res.stderr and "linear_attention" in res.stderr
    assert run_self(built, 3, False, tmp_path).verdict == "agrees"


# Variants a family's config switches between (each against its own module, as above).
VARIANTS = {"gpt_bigcode-multi-query": ("gpt_bigcode", dict(multi_query=True)),
            "gpt_bigcode-unscaled": ("gpt_bigcode", dict(multi_query=False, scale_attn_weights=False)),
            "olmo-no-clip": ("olmo", dict(clip_qkv=None)),
            "stablelm-no-qk-norm": ("stablelm", dict(qk_layernorm=False, partial_rotary_factor=0.5)),
            # Falcon's three query_key_value layouts, ALiBi (scaled with the scores) and the sequential block
            "falcon-multi-query": ("falcon", dict(multi_query=True, bias=True)),
            "falcon-per-head": ("falcon", dict(multi_query=False, bias=True)),
            "falcon-one-ln": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=KV, num_ln_in_parallel_attn=1)),
            "falcon-alibi": ("falcon", dict(multi_query=False, alibi=True, bias=True)),
            "falcon-multi-query-alibi": ("falcon", dict(multi_query=True, alibi=True)),
            "falcon-new-alibi": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=KV, alibi=True)),
            "falcon-sequential": ("falcon", dict(multi_query=False, parallel_attn=False, bias=True)),
            "phi-no-qk-norm": ("phi", dict(qk_layernorm=False, partial_rotary_factor=0.5)),
            "phi-full-rotary": ("phi", dict(qk_layernorm=False, partial_rotary_factor=1.0)),
            "persimmon-no-qk-norm": ("persimmon", dict(qk_layernorm=False, partial_rotary_factor=0.5)),
            "gpt_neo-local-first": ("gpt_neo", dict(attention_types=[[["local", "global"], 2]], window_size=2)),
            "opt-post-norm": ("opt", dict(do_layer_norm_before=False)),  # OPT-350m
            "opt-no-affine-no-bias": ("opt", dict(layer_norm_elementwise_affine=False, enable_bias=False)),
            "albert-groups": ("albert", dict(num_hidden_groups=2, inner_group_num=2, embedding_size=32)),
            "lfm2-hybrid": ("lfm2", dict(full_attn_idxs=[1, 3])),  # conv layers 0 and 2 between attention
            "cohere-no-qk-norm": ("cohere", dict(use_qk_norm=False)),
            "llama4_text-no-qk-norm": ("llama4_text", dict(no_rope_layers=[1, 1, 1, 0], attn_temperature_tuning=True,
                                                           floor_scale=2, attn_scale=0.5, use_qk_norm=False)),
            "laguna-feature-gate": ("laguna", dict(layer_types=["sliding_attention", "full_attention"] * 2,
                                                    gating=False)),
            "laguna-heads-per-layer": ("laguna", dict(layer_types=["sliding_attention", "full_attention"] * 2,
                                                       num_attention_heads_per_layer=[4, 2, 4, 2])),
            "granite_swa-default-theta": ("granite_swa", dict(attention_multiplier=0.3)),
            # LFM3's sliding layers (default rotary) with and without the per-head gate; OLMoE's clamp after its
            # QK-norm (refused: attncli clamps before); MiniMax-M2's legacy rotary_dim; Qwen3-Next with biases
            # (its q_proj's bias holds the gate's: refused)
            "lfm3-sliding": ("lfm3", dict(layer_types=["sliding_attention", "conv"] * 2)),
            "lfm3-no-gate": ("lfm3", dict(layer_types=["sliding_attention", "conv"] * 2, use_attention_gate=False)),
            # its q_norm/k_norm eps is config.rms_norm_eps, which Lfm3Config maps to norm_eps (attribute_map): its
            # config.json has no rms_norm_eps (read as the default 1e-6 before: off by 1e-6 to 1e-5 at 1e-5)
            "lfm3-norm-eps": ("lfm3", dict(layer_types=["sliding_attention", "conv"] * 2, norm_eps=0.05)),
            "olmoe-clip": ("olmoe", dict(clip_qkv=0.5)),
            "minimax_m2-rotary-dim": ("minimax_m2", dict(rotary_dim=8)),
            "qwen3_next-bias": ("qwen3_next", dict(attention_bias=True)),
            "esm-rotary": ("esm", dict(position_embedding_type="rotary")),
            "esm-rotary-base": ("esm", dict(position_embedding_type="rotary", rope_theta=100.0)),
            "roformer-rotary-value": ("roformer", dict(rotary_value=True)),
            "hunyuan_v1_dense-ntk-alpha": ("hunyuan_v1_dense", dict(rope_parameters=dict(
                rope_type="dynamic", alpha=50.0, factor=2.0, rope_theta=10000.0))),
            # MLA: Q straight from q_proj (no q_lora_rank), half rotary; v_head_dim unlike qk_head_dim
            "deepseek_v3-q-proj-half": ("deepseek_v3", dict(MLA, q_lora_rank=None, rope_interleave=False, v_head_dim=12)),
            "deepseek_v2-q-proj": ("deepseek_v2", dict(MLA, q_lora_rank=None, v_head_dim=12)),
            # ModernBERT with a local layer 0 (attn_norm nn.Identity) and a global layer 1 (a LayerNorm), biases on
            # Wqkv, Wo and the norms; the decoder likewise
            "modernbert-local-first": ("modernbert", dict(layer_types=["sliding_attention", "full_attention"] * 2,
                                                          attention_bias=True, norm_bias=True)),
            "modernbert-decoder-local-first": ("modernbert-decoder", dict(
                layer_types=["sliding_attention", "full_attention"] * 2, attention_bias=True, norm_bias=True)),
            "modernbert-linear-rope": ("modernbert", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
            "modernbert-yarn": ("modernbert", dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}))}  # refused


# Variants whose every run must agree (the other rotary, gate and head layouts of the families above)
MUST_AGREE_VARIANTS = ["esm-rotary", "esm-rotary-base", "laguna-feature-gate", "laguna-heads-per-layer",
                       "granite_swa-default-theta", "lfm3-sliding", "lfm3-no-gate", "lfm3-norm-eps",
                       "minimax_m2-rotary-dim"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MUST_AGREE_VARIANTS)
def test_variant_with_a_new_step_agrees(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mt, over = VARIANTS[name]
    monkeypatch.setitem(OVERRIDES, mt, over)
    outcomes = sweep_one(mt)
    assert {o.verdict for o in outcomes.values()} == {"agrees"}, outcomes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_family_variant_verdict_is_the_documented_one(name: str) -> None:
    variant_as_documented(name, name, EXPECTED_VARIANTS)


# bfloat16 checkpoints, one per supported family (and the silently wrong ones most used in bf16): saved in
# bfloat16, compared with the same module whose weights are rounded to bfloat16 and computed in float32, so
# the tolerance stays 1e-5 (a reader that fails to convert a bf16 tensor, or reads one as another, shows).
BF16 = ["llama", "qwen3", "gemma3_text", "gpt_oss", "gpt2", "gpt_neox", "bert", "mistral", "granite", "olmo",
        "stablelm", "cohere2", "phi3", "nemotron", "vaultgemma", "smollm3", "roberta-prelayernorm", "starcoder2",
        "falcon", "gpt_neo", "bitnet", "llama4_text", "opt", "biogpt", "xglm", "bart", "whisper", "distilbert",
        "albert", "lfm2",
        "cohere", "olmo2", "olmo3", "hunyuan_v1_dense", "hunyuan_v1_moe", "nanochat", "deepseek_v3",
        "modernbert", "modernbert-decoder", "ultrabert", "roformer", "esm", "afmoe", "laguna", "granite_swa",
        "granitemoe_swa", "olmoe", "flex_olmo", "minimax_m2", "lfm3", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"]
BF16_SILENT = {k: SILENT[k] for k in BF16 if k in SILENT}


@pytest.mark.slow
@pytest.mark.parametrize("mt", [pytest.param(m, id=f"{m}-bf16", marks=[pytest.mark.xfail(reason=BF16_SILENT[m],
                                                                                      strict=True)]
                                             if m in BF16_SILENT else []) for m in BF16])
def test_bfloat16_checkpoint_verdict_is_the_documented_one(mt: str) -> None:
    as_documented(mt, f"{mt} bf16", EXPECTED_BF16, torch.bfloat16)


BF16_VARIANTS = ["falcon-multi-query", "falcon-per-head", "falcon-alibi", "phi-no-qk-norm", "persimmon-no-qk-norm",
                 "modernbert-local-first", "esm-rotary", "laguna-feature-gate", "laguna-heads-per-layer", "lfm3-sliding",
                 "minimax_m2-rotary-dim"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, id=f"{n}-bf16") for n in BF16_VARIANTS])
def test_bfloat16_variant_verdict_is_the_documented_one(name: str) -> None:
    variant_as_documented(name, f"{name} bf16", EXPECTED_VARIANTS_BF16, torch.bfloat16)


def main() -> None:  # python tests/test_families.py [model types or VARIANTS names... | --variants]: the table
    dtype = torch.bfloat16 if os.environ.get("ATTNCLI_SWEEP_BF16") else None
    names = sys.argv[1:] or model_types()
    if names == ["--variants"]:  # the variants table's rows (with ATTNCLI_SWEEP_BF16=1: the bfloat16 variants')
        names = BF16_VARIANTS if dtype is not None else list(VARIANTS)
    for mt in names:
        try:
            if mt in VARIANTS:  # a variant's name: its family with the variant's config
                base, over = VARIANTS[mt]
                saved = OVERRIDES.get(base)
                OVERRIDES[base] = over
                try:
                    verdict, detail = summary(sweep_one(base, dtype))
                finally:
                    OVERRIDES.pop(base)
                    if saved is not None:
                        OVERRIDES[base] = saved
            else:
                verdict, detail = summary(sweep_one(mt, dtype))
        except Skip as e:
            verdict, detail = "skipped", f"{e.why}: {e.detail}"
        except Exception as e:  # noqa: BLE001
            verdict, detail = "harness", f"{type(e).__name__}: {e}"
        print(f"{mt}\t{verdict}\t{shown(detail)}", flush=True)


if __name__ == "__main__":
    main()
