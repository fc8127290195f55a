"""Options: how to compute, each declared once.

An option is one field of :class:`Options`, declared with :func:`option`: its type (the
annotation), its default, its check, and how the command line offers it (help, panel, short
flag, which commands). From that one declaration follow the typed ``Options``, the checks and
the CLI's flags (attncli.cli.options builds them; this module imports neither Typer nor numpy).

Every option reaches the library the same way, whether it was a command-line flag, an entry
of a problem file's ``options:`` or a keyword of :func:`attncli.attend`: as a field of
:class:`Options`, checked by :meth:`Options.merged` against the same rules (the flag's
choices, numbers that are finite and in range), with a message that names where the value
came from (``--temperature``, ``x.yaml: option temperature``, ``attend()``).
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, get_args, get_origin

from attncli.core.alibi import FORMS as ALIBI_FORMS
from attncli.core.backend import BACKENDS, DEVICES, DTYPES
from attncli.core.scoring import ACTIVATIONS, ALIASES, SCALINGS, SCORES
from attncli.errors import InputError

MaskConvention = Literal["keep", "drop"]
CausalAlign = Literal["top-left", "bottom-right"]
# HF Llama's rotate_half; GPT-J / Meta's pairs; nanochat's rotate_half with the signs swapped (each pair turned by -θ)
RopeMode = Literal["half", "interleaved", "half-reversed"]
# QK-norm kinds: RMSNorm · w (Qwen3), · (1 + w) (Gemma), LayerNorm per head (StableLM, Cohere, Phi, Persimmon),
# RMSNorm over the token's H·d features, every head at once (OLMo 2/3); weights (d,) shared, (H, d) per head, or none
QkNorm = Literal["rms", "rms1p", "layernorm", "rms-full"]
QkNormAt = Literal["before-rope", "after-rope"]  # where the QK-norm sits: Qwen3 before RoPE, HunYuan/nanochat after
RopeRounding = Literal["each", "once", "once-float32"]  # how a half-precision q, k are rotated (ops.rotate)
RopeFreqs = Literal["float32", "bfloat16", "float16"]  # the precision RoPE's inverse frequencies are held in
SinkForm = Literal["logit", "scale"]  # sinks in the softmax's denominator (gpt-oss) or as a scale after (Granite SWA)
MASK_CONVENTIONS: tuple[str, ...] = get_args(MaskConvention)
ROPE_MODES: tuple[str, ...] = get_args(RopeMode)
QK_NORMS: tuple[str, ...] = get_args(QkNorm)
ROPE_ROUNDINGS: tuple[str, ...] = get_args(RopeRounding)
QK_NORM_PLACES: tuple[str, ...] = get_args(QkNormAt)
CAUSAL_ALIGNS: tuple[str, ...] = get_args(CausalAlign)
MAX_HIDDEN = 1 << 16  # a hidden width beyond this is a typo, not a model (its weights alone would be GBs)
MAX_SEED = (1 << 63) - 1
MAX_POSITION = 1 << 53  # positions, offsets and windows: whole numbers float64 holds exactly (RoPE's angles)

# ---- how an option is declared ------------------------------------------------------------

COMPUTING = frozenset({"run", "self", "check", "examples run", "view"})  # the commands that build a problem
PROJECTING = frozenset({"self", "check", "examples run", "view"})  # those that take projections and heads flags
NO_FLAG = frozenset[str]()  # an option of files and attend() only

# help panels, in the order --help-all shows them: the common tasks first (--help shows the essential options)
SCORING = "Scores"
COMPUTE = "Computation"
MASKING = "Masks and valid lengths"
LABELS = "Labels"
PARAMS = "Score parameters"
TODAY = "Today's models"
MULTIHEAD = "Multi-head"
OUTPUT = "Output"
EXPLAIN = "Explanations"
PICTURES = "Pictures"
CHECK = "Check"
VIEWER = "Viewer"
PANELS = (CHECK, VIEWER, SCORING, MASKING, OUTPUT, EXPLAIN, PICTURES, MULTIHEAD, PARAMS, LABELS, TODAY, COMPUTE)


@dataclass(frozen=True)
class Opt:
    """One option, declared once (as the ``metadata`` of a dataclass field, by :func:`option`): the field's
    name and annotation give its name and type; the rest says how to check it and how to offer it."""

    default: Any
    help: str
    panel: str
    commands: frozenset[str] | None = None  # the commands offering it as a flag (None: its group's COMMANDS)
    short: str | None = None  # e.g. -t
    flag: str | None = None  # the long flag, when not --NAME
    off: str | None = None  # a switch's negative flag (default --no-NAME)
    choices: Callable[[], Sequence[str]] | None = None  # a registry's keys, read when needed (not at import)
    hidden: Callable[[], Sequence[str]] | None = None  # further accepted choices, not listed (aliases)
    check: Callable[[Any, str], Any] | None = None  # value, where -> the value checked and converted
    label: str | None = None  # its name in messages (default: the field's)
    flag_type: Any = None  # the flag's type where it differs from the field's (rope_scaling: JSON text)
    min: float | None = None  # range the flag enforces when parsed (Typer's min=, max=)
    max: float | None = None
    essential: bool = False  # among what a newcomer needs first (short --help)
    name: str = ""  # filled in from the field by declared()

    @property
    def long(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def option(default: Any, help: str, panel: str, **kw: Any) -> Any:
    """A dataclass field declared as an option (see :class:`Opt`)."""
    return field(default=default, metadata={"option": Opt(default, help, panel, **kw)})


@functools.cache
def declared(cls: type) -> dict[str, Opt]:
    """The options declared by ``cls``'s fields, by name, in declaration order."""
    out = {}
    for f in fields(cls):
        spec = f.metadata.get("option")
        if spec is not None:
            out[f.name] = replace(spec, name=f.name, choices=spec.choices or _literal_choices(cls, f))
    return out


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls`` (once: resolving them compiles each annotation's text)."""
    import typing

    return typing.get_type_hints(cls)


def _literal_choices(cls: type, f: Field[Any]) -> Callable[[], Sequence[str]] | None:
    """A Literal annotation's values as choices (``causal_align``, ``mask_convention``, ...)."""
    hint = hints(cls)[f.name]
    for t in (hint, *get_args(hint)):
        if get_origin(t) is Literal:
            values = get_args(t)
            return lambda: values
    return None


# ---- one check per kind of value ------------------------------------------------------------


class _Bad(Exception):
    """What is wrong with one option's value; check_option names the option and where it came from."""


# A number written as text (a quoted value in a file): plain decimal notation only. Python's float() and int()
# also take '1_000', full-width digits and surrounding blanks, which no file format means as a number.
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
                          re.IGNORECASE | re.ASCII)


def _plain(value: Any, what: str) -> Any:
    if isinstance(value, str) and not _NUMBER_TEXT.fullmatch(value):
        raise _Bad(f"must be {what}, got {_short(value)} (write plain digits, e.g. 1000)")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Bad(f"must be a number, got {_short(value)}")
    value = _plain(value, "a number")
    try:
        x = float(value)
    except (ValueError, OverflowError):
        raise _Bad(f"must be a number that fits a float, got {_short(value)}") from None
    return x


def _whole(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Bad(f"must be a whole number, got {_short(value)}")
    value = _plain(value, "a whole number")
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


def check_local_window(radius: Any, where: str = "--local-window") -> int:
    """The radius R of a bidirectional local window, or an InputError when it is not a whole number >= 0."""
    if isinstance(radius, bool) or not isinstance(radius, numbers.Integral) or not 0 <= int(radius) <= MAX_POSITION:
        raise InputError(f"the local window must be a whole number of positions from 0 to {MAX_POSITION:,} (query i "
                         f"sees key j when |j - i| <= R, R keys on each side), got {_short(radius)}", where)
    return int(radius)


def check_chunk(chunk: Any, where: str = "--chunk") -> int:
    """The chunk size C, or an InputError when it is not a whole number >= 1."""
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or not 1 <= int(chunk) <= MAX_POSITION:
        raise InputError(f"the chunk must be a whole number of positions from 1 to {MAX_POSITION:,} (query i sees the "
                         f"keys of its own chunk, j // C == i // C, up to itself), got {_short(chunk)}", where)
    return int(chunk)


def check_clip(clip: Any, where: str = "--clip-qkv") -> float:
    """The clamp C of q, k, v, or an InputError when it is not a finite number > 0."""
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not math.isfinite(clip) or clip <= 0:
        raise InputError(f"the clamp must be a finite number > 0 (q, k, v clamped to [-C, C]), got {_short(clip)}",
                         where)
    return float(clip)


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
        if not _NUMBER_TEXT.fullmatch(value):  # '1_000', ' 7 ': left as text, which the check refuses
            return value
        value = float(value)
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
    if (missing := rope_scaling_missing(value)) is not None:
        raise _Bad(missing)
    lo, hi = numbers_.get("low_freq_factor"), numbers_.get("high_freq_factor")
    if lo is not None and hi is not None and not hi > lo:  # llama3 divides by high - low
        raise _Bad(f"high_freq_factor ({hi:g}) must be above low_freq_factor ({lo:g})")
    return dict(value)


# what each rope_type cannot be computed without (transformers.modeling_rope_utils reads them unguarded)
ROPE_SCALING_NEEDS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",), "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
ROPE_FACTOR_MIN = 1e-30  # the rotary frequencies (at most 1) are divided by the factor: below this they overflow


def rope_scaling_missing(value: Mapping[str, Any]) -> str | None:
    """What a rope_scaling mapping lacks for its rope_type ("rope_type 'linear' needs 'factor'"), or None."""
    kind = value.get("rope_type", value.get("type", "default"))
    missing = [k for k in ROPE_SCALING_NEEDS.get(str(kind), ()) if value.get(k) is None]
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    return f"rope_type {_short(kind)} needs {', '.join(repr(k) for k in missing)}, which {verb} not given"


# key: (lowest, whether the lowest itself is allowed, highest, in words); 0 for beta_* and mscale* means "not
# set" as in transformers (``rope_scaling.get("beta_fast") or 32``)
ROPE_SCALING_RANGES: dict[str, tuple[float, bool, float, str]] = {
    "factor": (ROPE_FACTOR_MIN, True, math.inf, f"a number >= {ROPE_FACTOR_MIN:g} (the rotary frequencies are "
                                                 "divided by it)"),
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



def _whole_in(low: int, high: int) -> Callable[[Any, str], int]:
    return lambda v, w: _whole(v, w, low, high)


def _keys(registry: Mapping[str, Any]) -> Callable[[], list[str]]:
    return lambda: list(registry)


# ---- the options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How to compute attention: every field can come from a problem file, a flag or the API."""

    COMMANDS: ClassVar[frozenset[str]] = COMPUTING  # the commands whose flags offer these (unless a field says)

    score: str = option(
        "scaled-dot", "Scoring function (default scaled-dot).", SCORING, short="-s", essential=True,
        choices=_keys(SCORES), hidden=_keys(ALIASES), check=_check_score)
    scale: float | None = option(  # multiply the scores by this instead of the score's scaling
        None, "Multiply the scores by this instead of the score's own scaling (e.g. 1/sqrt(d)).", SCORING,
        check=_check_scale)
    scaling: str | None = option(  # a SCALINGS key; None: the score's default
        None, "Scaling rule: sqrt-d (scaled-dot's default), none, seq (sqrt(d)·sqrt(n)), norm (‖S‖_F).", SCORING,
        choices=_keys(SCALINGS))
    temperature: float | None = option(  # divide the (scaled) scores by this
        None, "Divide the (scaled) scores by T before the softmax.", SCORING, short="-t",
        check=_check_temperature)
    mask_convention: MaskConvention = option(  # a 1/True in a boolean mask means keep (SDPA) or drop
        "keep", "keep (default, as PyTorch SDPA): 1/True takes part. drop (as key_padding_mask and the notes' "
                "score += mask·-1e9): 1/True is masked out.", MASKING, label="mask convention")
    mask_value: float | None = option(  # None: -inf, masked weights are exactly 0
        None, "Value given to masked scores (default -inf: masked weights are exactly 0; -1e6 reproduces d2l).",
        MASKING, label="mask value", check=_check_mask_value)
    causal: bool = option(
        False, "Mask keys after each query (as PyTorch is_causal).", MASKING, essential=True)
    causal_align: CausalAlign = option(
        "top-left", "When queries and keys differ in number: top-left (is_causal, default) or bottom-right "
                    "(causal_lower_right).", MASKING, label="causal alignment")
    dtype: str | None = option(  # None: float32 if every input is float32 (or half), else float64
        None, "Compute in float32 or float64 (default: float32 only if every input is float32).", COMPUTE,
        choices=lambda: DTYPES)
    backend: str | None = option(  # None: numpy unless the device needs torch
        None, "numpy (default, CPU) or torch (needs PyTorch).", COMPUTE, choices=lambda: BACKENDS)
    device: str = option(
        "cpu", "cpu (default), cuda or mps (imply torch), or auto (CUDA, then MPS, then the CPU).", COMPUTE,
        choices=lambda: DEVICES)
    keep_weights: bool = option(  # no flag: the CLI's plan decides (--steps output, --save FILE.npy)
        True, "False: the output alone, never holding the (..., m, n) weights.", COMPUTE, commands=NO_FLAG)
    hidden: int | None = option(  # width h of initialised score weights (default d_q)
        None, "Hidden width h of weights initialised without --weights (default: the query width).", PARAMS,
        min=1, label="hidden width", check=_whole_in(1, MAX_HIDDEN))
    seed: int | None = option(  # numpy default_rng seed for initialised weights and dropout (default 0)
        None, "Seed of numpy.random.default_rng for initialised weights (nn.Linear style, uniform "
              "±1/sqrt(fan_in)) and dropout (default 0); numpy and torch get the same numbers.", PARAMS,
        check=_whole_in(0, MAX_SEED))
    activation: str | None = option(  # additive/location (default tanh)
        None, "Activation of the additive and location scores (default tanh).", PARAMS, choices=_keys(ACTIVATIONS))
    bandwidth: float | None = option(  # gaussian: sigma of -‖q-k‖²/(2σ²) (default 1)
        None, "σ of the gaussian score -‖q-k‖²/(2σ²) (default 1).", PARAMS,
        check=_check_bandwidth)
    hard: bool = option(  # one-hot weights at each row's argmax
        False, "Hard attention: one-hot weights at each row's largest weight (ties: the first key).", COMPUTE,
        off="--soft")
    dropout: float = option(  # inverted dropout on the weights, as nn.Dropout in training
        0.0, "Inverted dropout on the weights as nn.Dropout(P) in training (default 0), seeded by --seed.", COMPUTE,
        min=0.0, max=1.0, check=_check_dropout)
    # today's models (shared/CONVENTIONS.md): every fact a model's config.json gives about its attention
    rope: RopeMode | None = option(  # rotary position embedding of q and k
        None, "Rotary position embedding of q and k: half (HF Llama rotate_half), interleaved (GPT-J, Meta's "
              "pairs) or half-reversed (nanochat: rotate_half = cat(x2, -x1), each pair turned by -θ). Query i at "
              "position P + i (--q-offset), key j at j.", TODAY, label="RoPE",
        check=check_rope_mode)
    rope_base: float = option(  # theta (config rope_theta)
        10000.0, "RoPE theta: frequencies base^(-2k/d) (default 10000; config rope_theta).", TODAY,
        label="RoPE base", check=_check_rope_base)
    rope_freqs: RopeFreqs = option(  # transformers' inv_freq buffer: float32, or cast by model.to(dtype)
        "float32", "The precision of RoPE's inverse frequencies: float32 (default: transformers' inv_freq as "
                   "from_pretrained loads it) or bfloat16/float16 (as model.to(dtype) or .half() leaves that buffer: "
                   "angles off by up to 2^-9 (bfloat16) or 2^-11 (float16) of position · frequency).", TODAY,
        label="RoPE frequencies")
    rotary_dim: int | None = option(  # rotate the first N features of each head only (GPT-J, GPT-NeoX)
        None, "Rotate only the first N features of each head (even; GPT-J rotary_dim, GPT-NeoX rotary_pct·d).",
        TODAY, label="rotary dim", check=_whole_in(1, MAX_HIDDEN))
    rope_scaling: Mapping[str, Any] | None = option(  # config rope_scaling: linear / llama3 / yarn / dynamic
        None, "config.json's rope_scaling as JSON or a .json/.yaml file: {\"rope_type\": \"linear\"|\"llama3\"|"
              "\"yarn\"|\"dynamic\", \"factor\": 8, ...}.", TODAY, flag_type=str, label="rope scaling",
        check=_check_rope_scaling)
    q_offset: int | None = option(  # query i at position P + i (None: 0, or n - m bottom-right); keys at j
        None, "Query i sits at position P + i (default 0; n - m with --causal-align bottom-right): a KV-cache step "
              "of m new queries over n keys.", TODAY, check=lambda v, w: check_q_offset(_integral(v), w))
    alibi: bool = option(  # add slope_h·(j - i) (Press et al.; slopes of the paper, or given)
        False, "ALiBi: add slope_h·(j - i) to the scores, slopes of the paper for the head count (heads: axis -3 "
               "of Q for run, --heads for self).", TODAY, label="ALiBi")
    alibi_form: str = option(  # how the ALiBi bias is computed and rounded: a key of attncli.core.alibi.FORMS
        "relative", "ALiBi's bias: relative (default, Press et al.: slope_h·(j - i)), absolute-f32 (HF Bloom: "
                    "fl32(slope_h·j), key j's absolute position in float32) or absolute-bf16 (HF Falcon: "
                    "bf16(bf16(slope_h)·bf16(j))). The same weights up to rounding; the absolute forms reproduce "
                    "the models' rounding.", TODAY, label="ALiBi form", choices=_keys(ALIBI_FORMS))
    alibi_scaled: bool = option(  # ALiBi added to the raw scores before the scale (Falcon): divided by 1/scale
        False, "ALiBi is added to the raw scores before the scale, so scaled with them (Falcon: (q·k + alibi) / "
               "sqrt(d)): the bias is divided by sqrt(d) (1 / the scale) after its form's rounding.", TODAY,
        label="ALiBi before the scale")
    window: int | None = option(  # sliding window: causal, each query sees W keys, itself included
        None, "Sliding window: causal, each query sees the W keys up to itself (HF sliding_window, FlashAttention "
              "window_size=(W-1, 0)).", TODAY, check=lambda v, w: check_window(_integral(v), w))
    local_window: int | None = option(  # bidirectional local window: |j - (P + i)| <= R, both sides (ModernBERT)
        None, "Local window on both sides: query i sees key j when |j - (P + i)| <= R, R keys before and R after it "
              "and itself (HF sliding_window_bidirectional_overlay; ModernBERT local layers: R = local_attention // 2, "
              "UltraBERT: R = sliding_window). Not causal by itself; --window is the causal one.", TODAY,
        label="local window", check=lambda v, w: check_local_window(_integral(v), w))
    chunk: int | None = option(  # chunked attention (Llama 4): causal, and keys of the query's own chunk only
        None, "Chunked attention: causal, and query i sees key j only in its own chunk of C positions, "
              "j // C == (P + i) // C (Llama 4 attention_chunk_size).", TODAY,
        check=lambda v, w: check_chunk(_integral(v), w))
    tuning_scale: float | None = option(  # Llama 4's temperature tuning: q_i times log(floor((P+i+1)/F) + 1)·a + 1
        None, "Temperature tuning of the queries (Llama 4 attn_scale a, on its NoPE layers): q_i is multiplied by "
              "log(floor((P + i + 1) / F) + 1) · a + 1, F from --tuning-floor.", TODAY, label="tuning scale",
        check=lambda v, w: _check_scale(v, w))
    tuning_floor: float = option(  # Llama 4 floor_scale
        8192.0, "The F of --tuning-scale (Llama 4 floor_scale, default 8192).", TODAY, label="tuning floor",
        check=lambda v, w: _positive(_number(v, w), w, "a positive number (positions per step of the tuning)"))
    softcap: float | None = option(  # scores become c·tanh(s / c) after scaling (Gemma 2)
        None, "Logit soft-capping: scores become C·tanh(s/C) after scaling, before the mask (Gemma 2).", TODAY,
        check=lambda v, w: check_softcap(_number(v, w), w))
    qk_norm: QkNorm | None = option(  # the norm of each head's q and k (q_norm / k_norm weights, optional biases)
        None, "QK-norm of q and k: rms (Qwen3, w·q/rms(q) per head), rms1p (Gemma 3, (1+w)·q/rms), layernorm "
              "(StableLM, Cohere: (q-mean)/std·w + b per head) or rms-full (OLMo 2: RMS over all H·d features of a "
              "token); q_norm/k_norm weights (d,), (H, d) per head or (H·d,) for rms-full, from --weights (default "
              "none: weightless).", TODAY, label="QK-norm")
    qk_norm_at: QkNormAt = option(  # before RoPE (Qwen3, Gemma 3, OLMo 2, StableLM, Cohere) or after (HunYuan, nanochat)
        "before-rope", "Where the QK-norm sits: before-rope (default: Qwen3, Gemma 3, StableLM, Cohere, OLMo 2) or "
                       "after-rope (HunYuan, nanochat, Llama 4).", TODAY, label="QK-norm placement")
    rms_wide: bool = option(  # a fact of a checkpoint's family (attncli.io.families): no flag
        False, "True: the RMSNorms (pre-norm, QK-norm, sub-norm) multiply by w in float32 and round once to a half "
               "dtype, as OLMo 2, GPT-OSS, Helium and AFMoE compute (w * x.float()).to(dtype); False: w times the "
               "rounded x (Llama, Qwen3). The same numbers in float32 and float64.", TODAY, commands=NO_FLAG,
        label="RMSNorm weight in float32")
    sink_form: SinkForm = option(  # a fact of a checkpoint's family (attncli.io.families): no flag
        "logit", "How sinks enter: logit (one more logit in the softmax's denominator: gpt-oss) or scale (softmax(s) "
                  "times sigmoid(logsumexp(s) - sink): Granite SWA). The same weights; in a half precision each "
                  "rounds as its model does.", TODAY, commands=NO_FLAG, label="sink form")
    rope_rounding: RopeRounding = option(  # a fact of a checkpoint's family (attncli.io.families): no flag
        "each", "How a half-precision q and k are rotated: each (cos and sin cast to the dtype, every operation "
                "rounded: Llama), once (in float32 by the cast cos and sin, rounded once: Cohere, ESM, ModernBERT) "
                "or once-float32 (in float32 by float32 cos and sin, rounded once: OLMo 2, Ernie 4.5, LFM3). The "
                "same numbers in float32 and float64.", TODAY, commands=NO_FLAG, label="RoPE rounding")
    norm_eps: float = option(  # the eps of that RMSNorm (config rms_norm_eps)
        1e-6, "eps of the QK-norm (default 1e-6; config rms_norm_eps, layer_norm_eps).", TODAY, label="norm eps",
        check=lambda v, w: _positive(_number(v, w), w, "a positive number (the QK-norm's eps)"))
    clip_qkv: float | None = option(  # OLMo: q, k, v clamped to [-C, C] right after the projections
        None, "Clamp q, k and v to [-C, C] right after the projections, before the heads split (OLMo clip_qkv).",
        MULTIHEAD, commands=PROJECTING, label="clip", check=lambda v, w: check_clip(_number(v, w), w))
    kv_heads: int | None = option(  # K/V heads of projected attention (grouped-query); None: W_k's width says
        None, "Grouped-query / multi-query attention: G K/V heads (a divisor of --heads); query head h reads K/V head "
              "h // (H/G). Default: as many as W_k's width holds.", MULTIHEAD, commands=PROJECTING, min=1,
        label="K/V heads", check=_whole_in(1, MAX_HIDDEN))

    def __post_init__(self) -> None:  # Options(...) and replace(...) are checked too, as the API's values
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                object.__setattr__(self, f.name, check_option(f.name, value, f"option {f.name}"))

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def merged(self, overrides: Mapping[str, Any], source: str = "options", flags: bool = False,
               origin: Callable[[str], str] | None = None) -> Options:
        """These options with ``overrides`` (those not None) applied, each checked by :func:`check_option`.

        ``source`` names where they came from (a file, ``attend()``); ``flags``: they are command-line
        flags, so a message names ``--flag``; ``origin``: where each came from by name (config.json and its key)."""
        specs = declared(Options)
        unknown = sorted(set(overrides) - set(specs))
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], list(specs), n=1, cutoff=0.6)
            if close:  # a typo: scor -> score
                raise InputError(f"unknown option {unknown[0]!r}; did you mean {close[0]!r}?", source)
            shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
            raise InputError(f"unknown option(s) {shown}", source)
        changes = {}
        for name, value in overrides.items():
            if value is None:
                continue
            where = specs[name].long if flags else origin(name) if origin is not None else f"{source}: option {name}"
            changes[name] = check_option(name, value, where)
        return replace(self, **changes)


def check_option(name: str, value: Any, where: str) -> Any:
    """``value`` for the option ``name``, checked and converted by the rule its declaration gives (whatever its
    origin: a flag, a file, attend())."""
    spec = declared(Options)[name]
    try:
        if spec.check is not None:
            return spec.check(value, where)
        if isinstance(spec.default, bool):
            return _flag(value, where)
        if spec.choices is not None:
            return _choice(value, where, list(spec.choices()))
        return value
    except _Bad as e:
        raise InputError(f"{spec.label or name} {e}", where) from None
