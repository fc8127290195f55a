"""config.json, read once and checked by type before anything computes with it (io layer).

    read_config(path)       bounded (1 MiB), regular files only, strict JSON: a key given twice,
                            NaN / Infinity, a 5,000-digit number is one line naming config.json
    check_config(cfg, src)  every key attncli may compute with, checked against KEYS: its type
                            (a bool is not a number, 2.5 is not an integer), finite, in range

A value that fails is one :class:`~attncli.errors.InputError` naming config.json, the key and what
was expected ("config.json: sliding_window is 2.5; expected a positive integer"). Readers then take
values with :func:`value`, which re-checks the one it returns (so a key read but missing from KEYS
cannot slip through unchecked).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attncli.core.options import ROPE_FACTOR_MIN, rope_scaling_problem
from attncli.errors import InputError
from attncli.io.files import open_regular

MAX_CONFIG = 1 << 20  # a config.json is a few KiB; 1 MiB is generous
MAX_WHOLE = 1 << 40  # integers in a config (heads, widths, windows, positions) stay below this
MAX_FLOAT = 1e30

LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention", "attention",
               "global", "local", "mamba", "conv", "moe", "dense", "hybrid", "recurrent")


def _show(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (bool, type(None), str)) else repr(v)
    return text if len(text) <= 40 else text[:39] + "…"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


Check = Callable[[Any], str | None]  # the value -> None if acceptable, else what was expected


def whole(lo: int = 1, hi: int = MAX_WHOLE) -> Check:
    what = "a positive integer" if lo == 1 else f"an integer >= {lo}"

    def check(v: Any) -> str | None:
        return None if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else what
    return check


def real(lo: float = 0.0, hi: float = MAX_FLOAT, *, open_lo: bool = True, open_hi: bool = False) -> Check:
    lo_s, hi_s = ("(" if open_lo else "["), (")" if open_hi else "]")
    what = (f"a finite number in {lo_s}{lo:g}, {hi:g}{hi_s}" if hi < MAX_FLOAT else
            f"a finite number {'>' if open_lo else '>='} {lo:g}")

    def check(v: Any) -> str | None:
        if not _number(v) or not math.isfinite(v):
            return what
        ok = (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
        return None if ok else what
    return check


def any_real(v: Any) -> str | None:
    return None if _number(v) and math.isfinite(v) and abs(v) <= MAX_FLOAT else "a finite number"


def flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def text(v: Any) -> str | None:
    return None if isinstance(v, str) and len(v) <= 200 else "a string"


def _layer_types(v: Any) -> str | None:
    what = f"a list of layer kinds ({', '.join(LAYER_TYPES[:3])}, ...)"
    if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
        return what
    bad = [t for t in v if t not in LAYER_TYPES]
    return f"{what}; {_show(bad[0])} is not one" if bad else None


def _bits(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(t, bool) or (isinstance(t, int) and t in (0, 1)) for t in v)
    return None if ok else "a list of 0/1 (one per layer)"


def _mapping(v: Any) -> str | None:
    return None if isinstance(v, dict) else "an object"


# key -> its check; None (JSON null) means "not set" (but for NOT_NULL)
KEYS: dict[str, Check] = {
    **{k: whole() for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "n_embd",
                            "n_head", "d_model", "d_kv", "num_heads", "nhead", "num_hidden_layers", "n_layer",
                            "num_layers", "max_position_embeddings", "n_positions", "rotary_dim", "num_kv_heads",
                            "relative_attention_num_buckets", "relative_attention_max_distance", "sliding_window",
                            "attention_chunk_size", "window_size", "num_ln_in_parallel_attn", "sliding_window_pattern",
                            "no_rope_layer_interval",
                            "original_max_position_embeddings", "dim", "n_heads", "n_kv_heads",
                            "decoder_attention_heads", "encoder_attention_heads", "attention_heads", "decoder_layers",
                            "encoder_layers", "n_layers", "num_hidden_groups", "inner_group_num", "kv_lora_rank",
                            "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "local_attention",
                            "global_attn_every_n_layers")},
    "max_window_layers": whole(0),
    **{k: real() for k in ("rope_theta", "rotary_emb_base", "rope_base", "rope_local_base_freq", "attention_multiplier",
                           "query_pre_attn_scalar", "attn_logit_softcapping", "clip_qkv", "beta_fast",
                           "beta_slow", "low_freq_factor", "high_freq_factor", "attention_factor", "mscale",
                           "mscale_all_dim", "logit_scale", "floor_scale", "attn_scale", "global_rope_theta",
                           "local_rope_theta")},
    "factor": real(ROPE_FACTOR_MIN, open_lo=False),  # rope_scaling's: the rotary frequencies are divided by it
    **{k: real(0.0, 1.0) for k in ("partial_rotary_factor", "rotary_pct")},
    **{k: real(0.0, 1.0, open_lo=False) for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps",
                                                    "norm_epsilon")},
    **{k: any_real for k in ("attention_in_multiplier", "attention_out_multiplier", "key_multiplier")},
    **{k: flag for k in ("use_sliding_window", "is_decoder", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                         "multi_query", "new_decoder_architecture", "alibi", "parallel_attn", "qk_layernorm",
                         "use_qk_norm", "use_bidirectional_attention", "do_layer_norm_before", "rotary_value",
                         "use_parallel_residual", "attn_temperature_tuning", "rope_interleave", "bias", "enable_bias",
                         "layer_norm_elementwise_affine", "use_prompt", "norm_bias", "attention_bias")},
    **{k: text for k in ("model_type", "position_embedding_type", "rope_type", "type", "attention_type")},
    "layer_types": _layer_types,
    "no_rope_layers": _bits,
    "rope_parameters": _mapping,
    "rope_scaling": _mapping,
}


KV_PAIRS = (("num_attention_heads", "num_key_value_heads"), ("num_attention_heads", "num_kv_heads"),
            ("n_head", "num_kv_heads"), ("n_heads", "n_kv_heads"), ("num_heads", "num_kv_heads"))


def problem(key: str, v: Any) -> str | None:
    """What ``v`` should have been for ``key`` (None: fine, or a key attncli does not check)."""
    check = KEYS.get(key)
    return None if v is None or check is None else check(v)


def _fail(key: str, v: Any, what: str, source: str) -> InputError:
    return InputError(f"{key} is {_show(v)}; expected {what}", source)


# keys that are never null in a config transformers builds a model from (its configs refuse None for them: a
# StrictDataclassFieldValidationError); a null one is refused, never filled in from the weights' shapes
NOT_NULL = ("num_attention_heads", "hidden_size", "n_head", "n_embd")


def check_config(cfg: dict[str, Any], source: str) -> None:
    """Every key of KEYS present in config.json (and in its rope_parameters / rope_scaling) has the right type
    and range; layer_types has one entry per layer."""
    for key in NOT_NULL:
        if key in cfg and cfg[key] is None:
            raise InputError(f"{key} is null; expected a positive integer (transformers builds no model without it)",
                             source)
    for key, v in cfg.items():
        if key == "sliding_window" and v == 0 and not isinstance(v, bool) and cfg.get("use_sliding_window") is False:
            continue  # Qwen2-MoE writes 0 for "no window" beside use_sliding_window false
        if (what := problem(key, v)) is not None:
            raise _fail(key, v, what, source)
    for outer in ("rope_parameters", "rope_scaling"):
        sub = cfg.get(outer)
        if not isinstance(sub, dict):
            continue
        per_type = bool(sub) and all(isinstance(x, dict) for x in sub.values())
        for params in sub.values() if per_type else [sub]:  # Gemma 3: one rope_parameters per layer type
            for key, v in params.items():
                if (what := problem(key, v)) is not None:
                    raise _fail(f"{outer}.{key}", v, what, source)
            if (wrong := rope_scaling_problem(params, kind_known=not per_type)) is not None:  # config.json's, not a flag's
                raise InputError(f"{outer}: {wrong}", source)
    for heads_key, kv_key in KV_PAIRS:  # grouped-query heads: the K/V heads divide the query heads
        h, g = cfg.get(heads_key), cfg.get(kv_key)
        if isinstance(h, int) and isinstance(g, int) and g >= 1 and h % g:
            raise InputError(f"{kv_key} is {g}, which does not divide {heads_key} ({h}): grouped-query attention "
                             f"needs a divisor of {h} (query head h reads K/V head h // (H_q / H_kv))", source)
    types, n = cfg.get("layer_types"), cfg.get("num_hidden_layers")
    if isinstance(types, list) and isinstance(n, int) and len(types) < n:
        raise InputError(f"layer_types has {len(types)} entries; expected one per layer ({n}, num_hidden_layers)",
                         source)
    nope = cfg.get("no_rope_layers")
    if isinstance(nope, list) and isinstance(n, int) and len(nope) < n:
        raise InputError(f"no_rope_layers has {len(nope)} entries; expected one per layer ({n}, num_hidden_layers)",
                         source)


def value(cfg: dict[str, Any] | None, key: str, source: str, default: Any = None) -> Any:
    """config.json's ``key`` (``default`` when absent or null), checked against KEYS."""
    if not cfg or cfg.get(key) is None:
        return default
    v = cfg[key]
    if (what := problem(key, v)) is not None:
        raise _fail(key, v, what, source)
    return v


# ---- reading the file ----------------------------------------------------------------------------

def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json_file(path: Path, what: str, limit: int = MAX_CONFIG) -> dict[str, Any]:
    """A JSON object from a regular file of at most ``limit`` bytes: no key twice, no NaN/Infinity."""
    source = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or e})", source) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a pipe or a device?)"
        raise InputError(f"is {kind}; expected a {what} (JSON)", source)
    if st.st_size > limit:
        raise InputError(f"is {st.st_size} bytes, larger than the {limit >> 10} KiB a {what} may have", source)
    try:
        with open_regular(path, source) as f:  # a FIFO swapped in after the stat is said, never waited on
            raw = f.read(limit + 1)
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or e})", source) from None
    if len(raw) > limit:
        raise InputError(f"is larger than the {limit >> 10} KiB a {what} may have", source)
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_constant)
    except _Duplicate as e:
        raise InputError(f"gives the key {_show(e.key)} twice; expected each key once", source) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError, a 5,000-digit integer
        raise InputError(f"is not valid JSON ({' '.join(str(e).split())[:100]})", source) from None
    if not isinstance(doc, dict):
        raise InputError(f"is not a JSON object; expected a {what}", source)
    return doc
