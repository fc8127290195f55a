"""Problem: validated inputs and options. The one place for shape checks and their messages."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli import validate as check
from attncli.backend import half_type, host_array
from attncli.errors import InputError
from attncli.scoring import ACTIVATIONS, SCALINGS, get_score

MASK_CONVENTIONS = ("keep", "drop")
CAUSAL_ALIGNS = ("top-left", "bottom-right")
ARRAY_TITLES = {"q": "Q", "k": "K", "v": "V", "valid_lens": "valid lengths", "mask": "mask"}


@dataclass(frozen=True)
class Options:
    """How to compute: every field can come from a problem file or the command line."""

    score: str = "scaled-dot"
    scale: float | None = None  # multiply the scores by this instead of the score's scaling
    scaling: str | None = None  # a SCALINGS key; None: the score's default
    temperature: float | None = None  # divide the (scaled) scores by this
    causal: bool = False
    causal_align: str = "top-left"
    mask_convention: str = "keep"  # a 1/True in --mask means keep (SDPA) or drop (key_padding_mask)
    mask_value: float | None = None  # None: -inf, masked weights are exactly 0
    dtype: str | None = None  # None: float32 if every input is float32, else float64
    backend: str | None = None
    device: str = "cpu"
    keep_weights: bool = True
    # score parameters and softmax variants (issue 3)
    activation: str | None = None  # additive/location: tanh (default), relu, identity
    bandwidth: float | None = None  # gaussian: sigma of -‖q-k‖²/(2σ²) (default 1)
    hidden: int | None = None  # width h of initialised score weights (default d_q)
    seed: int | None = None  # numpy default_rng seed for initialised weights and dropout (default 0)
    hard: bool = False  # one-hot weights at each row's argmax
    dropout: float = 0.0  # inverted dropout on the weights, as nn.Dropout in training

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def merged(self, overrides: dict[str, Any], source: str = "options") -> Options:
        """These options with ``overrides`` (those not None) applied, checked by name."""
        unknown = set(overrides) - self.field_names()
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(sorted(unknown))}", source)
        merged = replace(self, **{k: _coerce(k, v, source) for k, v in overrides.items() if v is not None})
        check.options(merged, source)  # a bad value is named where it came from: the file's key or the flag
        return merged


_FLOATS = {"scale", "temperature", "mask_value", "bandwidth", "dropout"}
_BOOLS = {"causal", "keep_weights", "hard"}
_INTS = {"hidden", "seed"}


def _coerce(name: str, value: Any, source: str) -> Any:
    """An option value from a file or an API call, checked for its type."""
    if name in _FLOATS:
        return check.number(name, value, source)
    if name in _INTS:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or not _is_whole(value):
            raise InputError(f"option {name} must be a whole number, got {value!r}", source)
        return int(float(value))
    if name in _BOOLS:
        if not isinstance(value, bool):
            raise InputError(f"option {name} must be true or false, got {value!r}", source)
        return value
    if not isinstance(value, str):
        raise InputError(f"option {name} must be a name, got {value!r}", source)
    return value


def _is_whole(value: int | float | str) -> bool:
    try:
        f = float(value)
    except ValueError:
        return False
    return f == f and abs(f) != float("inf") and f == int(f)


@dataclass
class Problem:
    """Validated q, k, v (numpy, host), masks, labels, options and where each array came from."""

    q: np.ndarray  # (..., m, d_q)
    k: np.ndarray  # (..., n, d_k)
    v: np.ndarray  # (..., n, d_v)
    valid_lens: np.ndarray | None = None  # as given: (B,), (B, m), batch or batch + (m,)
    mask: np.ndarray | None = None  # bool or float, broadcastable to (..., m, n)
    query_labels: list[str] | None = None
    key_labels: list[str] | None = None
    options: Options = field(default_factory=Options)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    # ---- derived, set by validate() ----
    batch_shape: tuple[int, ...] = ()
    query_limit: np.ndarray | None = None  # (..., m): keys j >= limit are masked (valid lens)
    result_dtype: str | None = None  # float16/bfloat16: every input came in it; computed in float32, cast back
    initialised: list[str] = field(default_factory=list)  # score weights drawn from --seed, not given

    @property
    def m(self) -> int:
        return int(self.q.shape[-2])

    @property
    def n(self) -> int:
        return int(self.k.shape[-2])

    @property
    def self_attention(self) -> bool:
        """Q, K and V are one and the same matrix (X)."""
        return self.k is self.q and self.v is self.k

    @property
    def dtype(self) -> str:
        if self.options.dtype:
            return self.options.dtype
        every_f32 = all(a.dtype in (np.float32, np.float16) for a in (self.q, self.k, self.v))  # half: in float32
        return "float32" if every_f32 else "float64"

    def where(self, name: str) -> str:
        """The file (or stdin / option) an array came from, for error messages."""
        return self.sources.get(name, "input")

    def _fail(self, name: str, message: str) -> InputError:
        return InputError(message, self.where(name))

    @classmethod
    def build(cls, q: Any, k: Any = None, v: Any = None, **kw: Any) -> Problem:
        """A validated Problem; k and v default to q (self-attention shorthand)."""
        k = q if k is None else k
        v = k if v is None else v
        p = cls(q=q, k=k, v=v, **kw)
        p.validate()
        return p

    def validate(self) -> None:
        o = self.options
        check.options(o)
        score = get_score(o.score)
        if o.scaling is not None and o.scaling not in SCALINGS:
            raise InputError(f"unknown scaling {o.scaling!r}; choose one of {', '.join(SCALINGS)}", "--scaling")
        if o.mask_convention not in MASK_CONVENTIONS:
            raise InputError(f"unknown mask convention {o.mask_convention!r}; choose keep or drop", "--mask-convention")
        if o.causal_align not in CAUSAL_ALIGNS:
            raise InputError(f"unknown causal alignment {o.causal_align!r}; choose top-left or bottom-right", "--causal-align")
        if o.temperature is not None and not (np.isfinite(o.temperature) and o.temperature > 0):
            raise InputError(f"temperature must be a positive number, got {o.temperature}", "--temperature")
        if o.scale is not None and not np.isfinite(o.scale):
            raise InputError(f"scale must be a finite number, got {o.scale}", "--scale")
        if o.mask_value is not None and (np.isnan(o.mask_value) or o.mask_value == np.inf):
            raise InputError(f"mask value must be a number or -inf, got {o.mask_value}", "--mask-value")
        self._check_variant_options()

        k_is_q, v_is_k = self.k is self.q, self.v is self.k
        halves = {half_type(a) for a in (self.q, self.k, self.v)}
        self.result_dtype = halves.pop() if len(halves) == 1 and not o.dtype else None
        self.q = self._matrix("q", self.q)
        self.k = self.q if k_is_q else self._matrix("k", self.k)
        self.v = self.k if v_is_k else self._matrix("v", self.v)
        q, k, v = self.q, self.k, self.v
        if score.same_width and q.shape[-1] != k.shape[-1]:
            raise self._fail("k", f"K has width {k.shape[-1]} but Q has width {q.shape[-1]}; "
                                  f"--score {score.name} needs equal widths (use --score additive for different widths)")
        if k.shape[-2] != v.shape[-2]:
            raise self._fail("v", f"V has {v.shape[-2]} rows but K has {k.shape[-2]} keys; each key needs one value row")
        try:
            self.batch_shape = tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
        except ValueError:
            raise self._fail("k", f"batch axes do not match: Q {q.shape}, K {k.shape}, V {v.shape} "
                                  "(leading axes must be equal or 1)") from None
        self._check_labels()
        self.query_limit = self._valid_lens_limit()
        self.mask = self._check_mask()
        from attncli.weights import prepare

        self.params, self.initialised = prepare(score, self.params, int(q.shape[-1]), int(k.shape[-1]), o,
                                                self.where("weights"))

    # ---- pieces of validate ----

    def _check_variant_options(self) -> None:
        """Score parameters and softmax variants: activation, bandwidth, hidden, seed, dropout."""
        o = self.options
        if o.activation is not None and o.activation not in ACTIVATIONS:
            raise InputError(f"unknown activation {o.activation!r}; choose one of {', '.join(ACTIVATIONS)}", "--activation")
        if o.bandwidth is not None and not (np.isfinite(o.bandwidth) and o.bandwidth > 0):
            raise InputError(f"bandwidth must be a positive number, got {o.bandwidth}", "--bandwidth")
        if o.hidden is not None and o.hidden < 1:
            raise InputError(f"hidden width must be at least 1, got {o.hidden}", "--hidden")
        if o.seed is not None and o.seed < 0:
            raise InputError(f"seed must be 0 or more, got {o.seed}", "--seed")
        if not (0.0 <= o.dropout <= 1.0):
            raise InputError(f"dropout must be a probability between 0 and 1, got {o.dropout}", "--dropout")

    def _matrix(self, name: str, a: Any) -> np.ndarray:
        title = ARRAY_TITLES[name]
        a = numeric_array(a, title, self.where(name))
        if a.ndim == 0:
            raise self._fail(name, f"{title} is a single number; expected a vector or a matrix (..., rows, width)")
        if a.ndim == 1:
            a = a[None, :]  # a 1-D q is one query (and a 1-D k or v one key)
        if a.size == 0:
            raise self._fail(name, f"{title} is empty (shape {a.shape})")
        return a

    def _check_labels(self) -> None:
        for attr, count, what in (("query_labels", self.m, "queries"), ("key_labels", self.n, "keys")):
            labels = getattr(self, attr)
            if labels is None:
                continue
            labels = [printable(str(x)) for x in check.labels(labels, self.sources.get(attr, attr)) or []]
            if len(labels) != count:
                raise InputError(f"{len(labels)} {attr.replace('_', ' ')} given for {count} {what}",
                                 self.sources.get(attr, f"--{attr.replace('_', '-')}"))
            setattr(self, attr, labels)

    def _valid_lens_limit(self) -> np.ndarray | None:
        """Valid lengths as a per-query key limit, shape broadcastable to batch + (m,)."""
        if self.valid_lens is None:
            return None
        vl = numeric_array(self.valid_lens, "valid lengths", self.where("valid_lens"))
        if not np.all(vl == np.round(vl)):
            raise self._fail("valid_lens", f"valid lengths must be whole numbers, got {vl.tolist()}")
        if np.any(vl < 0) or np.any(vl > self.n):  # checked before the cast: 1e300 is no int64
            bad = vl[(vl < 0) | (vl > self.n)]
            raise self._fail("valid_lens", f"valid length {bad.flat[0]:g} is out of range: there are {self.n} keys "
                                           f"(each valid length must be between 0 and {self.n})")
        vl = vl.astype(np.int64)
        b, m = self.batch_shape, self.m
        nb = len(b)
        s = vl.shape
        if s in ((), (1,)):
            return vl.reshape((1,) * nb + (1,))
        if s == b + (m,) and nb:
            return vl
        if nb and s == (b[0],):
            return vl.reshape((b[0],) + (1,) * (nb - 1) + (1,))  # d2l: one length per batch element
        if nb and s == (b[0], m):
            return vl.reshape((b[0],) + (1,) * (nb - 1) + (m,))  # d2l: one length per query
        if nb and s == b:
            return vl[..., None]
        if not nb and s == (m,):
            return vl
        want = f"({b[0]},) or ({b[0]}, {m})" if nb else f"a single number or ({m},)"
        raise self._fail("valid_lens", f"valid lengths have shape {s}; expected {want} for Q of shape {self.q.shape}")

    def _check_mask(self) -> np.ndarray | None:
        if self.mask is None:
            return None
        mk = mask_array(self.mask, "mask", self.where("mask"))
        target = self.batch_shape + (self.m, self.n)
        try:
            full = np.broadcast_shapes(mk.shape, target)
        except ValueError:
            full = None
        if full != target:
            raise self._fail("mask", f"mask has shape {mk.shape}, which does not broadcast to the scores' shape {target} "
                                     "(batch..., queries, keys)")
        return mk


def mask_array(a: Any, title: str, source: str) -> np.ndarray:
    """A mask as given: boolean (0/1 integers count as boolean) or float (added to the scores)."""
    given = np.asarray(a)
    if given.dtype == bool:
        return given
    mk = numeric_array(given, title, source, allow_inf=True)
    if not np.issubdtype(given.dtype, np.floating):
        check.integer_mask(np.asarray(given), title, source)
        return mk.astype(bool)  # 0/1 integers are a boolean mask
    check.float_mask(mk, title, source)
    return mk


def numeric_array(a: Any, title: str, source: str, allow_inf: bool = False) -> np.ndarray:
    """``a`` as a real float64/float32 array, or an InputError naming the array and the problem."""
    try:
        arr = np.asarray(host_array(a))
    except ValueError as e:  # ragged nested lists
        raise InputError(f"{title} is ragged: rows of different lengths ({e})", source) from None
    check.dims(arr.ndim, title, source)
    if arr.dtype == object:
        raise InputError(f"{title} is ragged or holds non-numbers (null, text, numbers too large for a float); "
                         "expected a rectangular array of numbers", source)
    if arr.dtype.kind in "US":
        raise InputError(f"{title} holds text where numbers belong", source)
    if arr.dtype.kind == "c":
        raise InputError(f"{title} holds complex numbers; attention needs real numbers", source)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{title} has dtype {arr.dtype}; expected numbers", source)
    if arr.dtype.kind == "b" and title not in ("mask",):
        raise InputError(f"{title} holds booleans where numbers belong", source)
    if arr.dtype.kind != "b" and title != "mask" and isinstance(a, (list, tuple)) and _holds_bool(a):
        raise InputError(f"{title} holds true/false among its numbers; expected numbers only", source)
    if arr.size == 0:
        raise InputError(f"{title} is empty (shape {arr.shape})", source)
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)  # float16 stays: the engine computes it in float32 and casts back
    arr = check.within_float64(arr, title, source)
    bad = np.isnan(arr) if allow_inf else ~np.isfinite(arr)
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        what = "NaN" if np.isnan(arr[idx]) else "an infinite value"
        raise InputError(f"{title} holds {what} at index {list(idx)}; inputs must be finite numbers", source)
    return arr


def feature_width(a: Any, title: str, source: str) -> int:
    """The width of an input of tokens, (tokens, features) or (batch, tokens, features), checked as
    numbers first (a ragged list, a mapping or text is one line naming it, not a numpy error)."""
    shape = numeric_array(a, title, source).shape
    if len(shape) not in (2, 3):
        raise InputError(f"{title} has shape {tuple(shape)}; expected (tokens, features) or (batch, tokens, features)",
                         source)
    return int(shape[-1])


def _holds_bool(a: list[Any] | tuple[Any, ...]) -> bool:
    """Whether nested lists (from YAML/JSON) hold a bool among numbers (numpy would read it as 0/1)."""
    stack: list[Any] = [a]
    while stack:
        x = stack.pop()
        if isinstance(x, bool):
            return True
        if isinstance(x, (list, tuple)):
            stack.extend(x)
    return False


def printable(label: str, limit: int = 200) -> str:
    """A label safe to print: control characters (an escape sequence in a label downloaded from
    anywhere could clear or retitle the terminal) written as escapes, and at most ``limit`` long."""
    out = "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in label)
    return out if len(out) <= limit else out[: limit - 1] + "…"
