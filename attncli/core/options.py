"""Options: how to compute, typed and validated in one place.

Every option reaches the library the same way, whether it was a command-line flag, an entry
of a problem file's ``options:`` or a keyword of :func:`attncli.attend`: as a field of
:class:`Options`, checked by :meth:`Options.merged` against the same rules (the flag's
choices, numbers that are finite and in range), with a message that names where the value
came from (``--temperature``, ``x.yaml: option temperature``, ``attend()``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

from attncli.core.backend import BACKENDS, DEVICES, DTYPES
from attncli.core.scoring import ACTIVATIONS, ALIASES, SCALINGS, SCORES
from attncli.errors import InputError

MaskConvention = Literal["keep", "drop"]
CausalAlign = Literal["top-left", "bottom-right"]
RopeMode = Literal["half", "interleaved"]  # HF Llama's rotate_half; GPT-J / Meta's pairs
QkNorm = Literal["rms", "rms1p"]  # RMSNorm · w (Qwen3), · (1 + w) (Gemma)
MASK_CONVENTIONS: tuple[str, ...] = get_args(MaskConvention)
ROPE_MODES: tuple[str, ...] = get_args(RopeMode)
QK_NORMS: tuple[str, ...] = get_args(QkNorm)
CAUSAL_ALIGNS: tuple[str, ...] = get_args(CausalAlign)
MAX_HIDDEN = 1 << 16  # a hidden width beyond this is a typo, not a model (its weights alone would be GBs)
MAX_SEED = (1 << 63) - 1
MAX_POSITION = 1 << 53  # positions, offsets and windows: whole numbers float64 holds exactly (RoPE's angles)


@dataclass(frozen=True)
class Options:
    """How to compute attention: every field can come from a problem file, a flag or the API."""

    score: str = "scaled-dot"
    scale: float | None = None  # multiply the scores by this instead of the score's scaling
    scaling: str | None = None  # a SCALINGS key; None: the score's default
    temperature: float | None = None  # divide the (scaled) scores by this
    causal: bool = False
    causal_align: CausalAlign = "top-left"
    mask_convention: MaskConvention = "keep"  # a 1/True in a boolean mask means keep (SDPA) or drop
    mask_value: float | None = None  # None: -inf, masked weights are exactly 0
    dtype: str | None = None  # a DTYPES entry; None: float32 if every input is float32 (or half), else float64
    backend: str | None = None  # a BACKENDS entry; None: numpy unless the device needs torch
    device: str = "cpu"
    keep_weights: bool = True  # False: the output alone, never holding the (..., m, n) weights
    activation: str | None = None  # additive/location: an ACTIVATIONS key (default tanh)
    bandwidth: float | None = None  # gaussian: sigma of -‖q-k‖²/(2σ²) (default 1)
    hidden: int | None = None  # width h of initialised score weights (default d_q)
    seed: int | None = None  # numpy default_rng seed for initialised weights and dropout (default 0)
    hard: bool = False  # one-hot weights at each row's argmax
    dropout: float = 0.0  # inverted dropout on the weights, as nn.Dropout in training
    # today's models (shared/CONVENTIONS.md): every fact a model's config.json gives about its attention
    kv_heads: int | None = None  # K/V heads of projected attention (grouped-query); None: W_k's width says
    qk_norm: QkNorm | None = None  # RMSNorm of each head's q and k before RoPE (q_norm / k_norm weights)
    norm_eps: float = 1e-6  # the eps of that RMSNorm (config rms_norm_eps)
    rope: RopeMode | None = None  # rotary position embedding of q and k
    rope_base: float = 10000.0  # theta (config rope_theta)
    rotary_dim: int | None = None  # rotate the first N features of each head only (GPT-J, GPT-NeoX)
    rope_scaling: Mapping[str, Any] | None = None  # config rope_scaling: rope_type linear / llama3 / yarn / dynamic
    q_offset: int | None = None  # query i at position P + i (None: 0, or n - m bottom-right); keys at j
    alibi: bool = False  # add slope_h·(j - i) (Press et al.; slopes of the paper, or given)
    window: int | None = None  # sliding window: causal, each query sees W keys, itself included
    softcap: float | None = None  # scores become c·tanh(s / c) after scaling (Gemma 2)

    def __post_init__(self) -> None:  # Options(...) and replace(...) are checked too, as the API's values
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                object.__setattr__(self, f.name, check_option(f.name, value, f"option {f.name}"))

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def merged(self, overrides: dict[str, Any], source: str = "options", flags: bool = False) -> Options:
        """These options with ``overrides`` (those not None) applied, each checked by :func:`check_option`.

        ``source`` names where they came from (a file, ``attend()``); ``flags``: they are command-line
        flags, so a message names ``--flag``."""
        unknown = sorted(set(overrides) - self.field_names())
        if unknown:
            shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
            raise InputError(f"unknown option(s) {shown}", source)
        changes = {}
        for name, value in overrides.items():
            if value is None:
                continue
            where = f"--{name.replace('_', '-')}" if flags else f"{source}: option {name}"
            changes[name] = check_option(name, value, where)
        return replace(self, **changes)


# ---- one check per field ----------------------------------------------------------------


class _Bad(Exception):
    """What is wrong with one option's value; check_option names the option and where it came from."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Bad(f"must be a number, got {_short(value)}")
    try:
        x = float(value)
    except (ValueError, OverflowError):
        raise _Bad(f"must be a number that fits a float, got {_short(value)}") from None
    return x


def _whole(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Bad(f"must be a whole number, got {_short(value)}")
    try:
        n = int(value) if isinstance(value, int) else int(float(value)) if float(value) == int(float(value)) else None
    except (ValueError, OverflowError):
        n = None
    if n is None:
        raise _Bad(f"must be a whole number, got {_short(value)}")
    if n < low:
        raise _Bad(f"must be {low} or more, got {_short(value)}")
    if n > high:
        raise _Bad(f"must be at most {high}, got {_short(value)}")
    return n


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"must be true or false, got {_short(value)}")
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...] | list[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _Bad(f"must be one of {', '.join(choices)}; got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _positive(x: float, where: str, what: str = "a positive number") -> float:
    if not (math.isfinite(x) and x > 0):
        raise _Bad(f"must be {what}, got {x:g}")
    return x


def _check_bandwidth(value: Any, where: str) -> float:
    sigma = _positive(_number(value, where), where)
    if sigma * sigma == 0 or not math.isfinite(1.0 / (2.0 * sigma * sigma)):  # 1e-200: no ZeroDivisionError
        raise _Bad(f"is too small: 1/(2σ²) overflows for σ = {sigma:g}")
    return sigma


def _check_temperature(value: Any, where: str) -> float:
    t = _positive(_number(value, where), where)
    if not math.isfinite(1.0 / t):
        raise _Bad(f"is too small: dividing by {t:g} overflows")
    return t


def _check_scale(value: Any, where: str) -> float:
    x = _number(value, where)
    if not math.isfinite(x):
        raise _Bad(f"must be a finite number, got {x:g}")
    return x


def _check_mask_value(value: Any, where: str) -> float:
    x = _number(value, where)
    if math.isnan(x) or x >= 0:  # 1e308 with --causal let the masked keys win
        raise _Bad(f"must be a negative number or -inf (masked scores must stay below the others; d2l: -1e6), "
                   f"got {x:g}")
    return x


def _check_score(value: Any, where: str) -> str:
    if not isinstance(value, str) or (value not in SCORES and value not in ALIASES):
        raise InputError(f"unknown score {_short(value)}; choose one of {', '.join(sorted([*SCORES, *ALIASES]))}", where)
    return value


def _check_dropout(value: Any, where: str) -> float:
    p = _number(value, where)
    if not 0.0 <= p <= 1.0:  # NaN too
        raise _Bad(f"must be a probability between 0 and 1, got {p:g}")
    return p


def check_rope_mode(mode: Any, where: str = "--rope") -> str:
    """The RoPE convention, or an InputError naming the choices."""
    if mode not in ROPE_MODES:
        raise InputError(f"unknown RoPE convention {_short(mode)}; choose one of {', '.join(ROPE_MODES)}", where)
    return str(mode)


def check_window(window: Any, where: str = "--window") -> int:
    """The window, or an InputError when it is below 1 (a query always sees itself)."""
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or not 1 <= int(window) <= MAX_POSITION:
        raise InputError(f"the sliding window must be a whole number of keys from 1 to {MAX_POSITION:,} (each query "
                         f"sees W keys, itself included), got {_short(window)}", where)
    return int(window)


def check_softcap(cap: Any, where: str = "--softcap") -> float:
    """The cap, or an InputError when it is not a finite number > 0."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not math.isfinite(cap) or cap <= 0:
        raise InputError(f"the soft-cap must be a finite number > 0 (scores become c·tanh(s/c)), got {_short(cap)}",
                         where)
    return float(cap)


def check_q_offset(offset: Any, where: str = "--q-offset") -> int:
    """The query offset P (query i at position P + i), or an InputError when negative."""
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or not 0 <= int(offset) <= MAX_POSITION:
        raise InputError(f"the query offset must be a whole number from 0 to {MAX_POSITION:,} (query i sits at "
                         f"position P + i), got {_short(offset)}", where)
    return int(offset)


def _integral(value: Any) -> Any:
    """A whole number given as a float or a string (YAML, the command line) as an int; else as it is."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


ROPE_SCALING_KEYS = {"rope_type", "type", "factor", "original_max_position_embeddings", "max_position_embeddings",
                     "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
                     "mscale_all_dim", "truncate", "rope_theta", "partial_rotary_factor"}


def _check_rope_scaling(value: Any, where: str) -> Mapping[str, Any]:
    """A config.json ``rope_scaling`` mapping (or its JSON text): known keys, numbers where numbers go."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except RecursionError:
            raise _Bad("is nested too deeply: give a flat JSON object like {\"rope_type\": \"linear\", "
                       "\"factor\": 4}") from None
        except ValueError:
            raise _Bad(f"must be a JSON object like {{\"rope_type\": \"linear\", \"factor\": 4}}, got {_short(value)}") from None
    if not isinstance(value, Mapping):
        raise _Bad(f"must be a mapping as config.json's rope_scaling, got {_short(value)}")
    unknown = sorted(set(map(str, value)) - ROPE_SCALING_KEYS)
    if unknown:
        raise _Bad(f"has unknown key(s) {', '.join(unknown)}; config.json's rope_scaling has "
                   f"{', '.join(sorted(ROPE_SCALING_KEYS))}")
    kind = value.get("rope_type", value.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise _Bad(f"rope_type {_short(kind)} is not supported; choose one of {', '.join(ROPE_TYPES)}")
    numbers_ = {}
    for k, v in value.items():
        if k in ("rope_type", "type") or v is None:
            continue
        if k == "truncate":
            if not isinstance(v, bool):
                raise _Bad(f"truncate must be true or false, got {_short(v)}")
            continue
        try:  # a 400-digit integer is a number too large for a float, not a crash
            x = float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else math.nan
        except OverflowError:
            x = math.inf
        if not math.isfinite(x):
            raise _Bad(f"{k} must be a finite number, got {_short(v)}")
        low, included, high, what = ROPE_SCALING_RANGES.get(k, (-math.inf, True, math.inf, "a finite number"))
        if not (x >= low if included else x > low) or x > high:
            raise _Bad(f"{k} must be {what}, got {_short(v)}")
        numbers_[k] = x
    lo, hi = numbers_.get("low_freq_factor"), numbers_.get("high_freq_factor")
    if lo is not None and hi is not None and not hi > lo:  # llama3 divides by high - low
        raise _Bad(f"high_freq_factor ({hi:g}) must be above low_freq_factor ({lo:g})")
    return dict(value)


# key: (lowest, whether the lowest itself is allowed, highest, in words); 0 for beta_* and mscale* means "not
# set" as in transformers (``rope_scaling.get("beta_fast") or 32``)
ROPE_SCALING_RANGES: dict[str, tuple[float, bool, float, str]] = {
    "factor": (0, False, math.inf, "a number above 0"),
    "original_max_position_embeddings": (1, True, MAX_POSITION, f"a length from 1 to {MAX_POSITION:,}"),
    "max_position_embeddings": (1, True, MAX_POSITION, f"a length from 1 to {MAX_POSITION:,}"),
    "low_freq_factor": (0, False, math.inf, "a number above 0 (llama3 divides by it)"),
    "high_freq_factor": (0, False, math.inf, "a number above 0 (llama3 divides by it)"),
    "beta_fast": (0, True, math.inf, "a number of rotations >= 0 (YaRN takes its logarithm; 0: the default)"),
    "beta_slow": (0, True, math.inf, "a number of rotations >= 0 (YaRN takes its logarithm; 0: the default)"),
    "attention_factor": (0, True, math.inf, "a number >= 0"),
    "mscale": (0, True, math.inf, "a number >= 0"),
    "mscale_all_dim": (0, True, math.inf, "a number >= 0"),
    "rope_theta": (1, False, math.inf, "a base above 1"),
    "partial_rotary_factor": (0, False, 1, "a fraction above 0, at most 1"),
}


ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic")


def _check_rope_base(value: Any, where: str) -> float:
    base = _positive(_number(value, where), where)
    if base <= 1:
        raise _Bad(f"must be larger than 1 (the frequencies are base^(-2k/d)), got {base:g}")
    return base


CHECKS: dict[str, Any] = {
    "score": _check_score,
    "scale": _check_scale,
    "scaling": lambda v, w: _choice(v, w, list(SCALINGS)),
    "temperature": _check_temperature,
    "causal": _flag,
    "causal_align": lambda v, w: _choice(v, w, CAUSAL_ALIGNS),
    "mask_convention": lambda v, w: _choice(v, w, MASK_CONVENTIONS),
    "mask_value": _check_mask_value,
    "dtype": lambda v, w: _choice(v, w, DTYPES),
    "backend": lambda v, w: _choice(v, w, BACKENDS),
    "device": lambda v, w: _choice(v, w, DEVICES),
    "keep_weights": _flag,
    "activation": lambda v, w: _choice(v, w, list(ACTIVATIONS)),
    "bandwidth": _check_bandwidth,
    "hidden": lambda v, w: _whole(v, w, 1, MAX_HIDDEN),
    "seed": lambda v, w: _whole(v, w, 0, MAX_SEED),
    "hard": _flag,
    "dropout": _check_dropout,
    "kv_heads": lambda v, w: _whole(v, w, 1, MAX_HIDDEN),
    "qk_norm": lambda v, w: _choice(v, w, QK_NORMS),
    "norm_eps": lambda v, w: _positive(_number(v, w), w, "a positive number (the RMSNorm's eps)"),
    "rope": lambda v, w: check_rope_mode(v, w),
    "rope_base": _check_rope_base,
    "rotary_dim": lambda v, w: _whole(v, w, 1, MAX_HIDDEN),
    "rope_scaling": _check_rope_scaling,
    "q_offset": lambda v, w: check_q_offset(_integral(v), w),
    "alibi": _flag,
    "window": lambda v, w: check_window(_integral(v), w),
    "softcap": lambda v, w: check_softcap(_number(v, w), w),
}


LABELS = {"valid_lens": "valid lengths", "causal_align": "causal alignment", "mask_convention": "mask convention",
          "mask_value": "mask value", "keep_weights": "keep_weights", "hidden": "hidden width",
          "kv_heads": "K/V heads", "qk_norm": "QK-norm", "norm_eps": "norm eps", "rope": "RoPE", "rope_base": "RoPE base",
          "rotary_dim": "rotary dim", "rope_scaling": "rope scaling", "alibi": "ALiBi"}


def check_option(name: str, value: Any, where: str) -> Any:
    """``value`` for the option ``name``, checked and converted (one rule per field, whatever its origin)."""
    try:
        return CHECKS[name](value, where)
    except _Bad as e:
        raise InputError(f"{LABELS.get(name, name)} {e}", where) from None
