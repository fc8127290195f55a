"""Problem: validated inputs and options. The one place for shape checks and their messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core import heads
from attncli.core import validate as check
from attncli.core.alibi import FORMS as ALIBI_FORMS
from attncli.core.arrays import cut_labels, mask_array, numeric_array, printable
from attncli.core.backend import half_type
from attncli.core.options import CAUSAL_ALIGNS, MASK_CONVENTIONS, Options
from attncli.core.projections import RelativeBias
from attncli.core.scoring import CONSTANT_SCALINGS, get_score
from attncli.core.weights import prepare
from attncli.errors import InputError

__all__ = ["ARRAY_TITLES", "CAUSAL_ALIGNS", "MASK_CONVENTIONS", "Options", "Problem", "mask_array", "numeric_array",
           "printable"]

ARRAY_TITLES = {"q": "Q", "k": "K", "v": "V", "valid_lens": "valid lengths", "mask": "mask"}


class Shared:
    """What a core :class:`Problem` and a projected :class:`attncli.core.layer.Layer` answer alike, from
    their sizes (``m``, ``n``, ``head_count``, ``d_qk``) and the fields they share by name."""

    options: Options
    alibi_slopes: np.ndarray | None
    sources: dict[str, str]
    kv_heads: int | None

    @property
    def m(self) -> int:
        raise NotImplementedError

    @property
    def n(self) -> int:
        raise NotImplementedError

    @property
    def d_qk(self) -> int:
        raise NotImplementedError

    @property
    def head_count(self) -> int:
        raise NotImplementedError

    @property
    def n_rep(self) -> int:
        """Query heads per K/V head (grouped-query attention: query head h reads K/V head h // n_rep)."""
        return self.head_count // self.kv_heads if self.kv_heads else 1

    @property
    def query_offset(self) -> int:
        """The position of query 0 (query i at P + i, key j at j): --q-offset, else n - m bottom-right, else 0."""
        o = self.options
        if o.q_offset is not None:
            return o.q_offset
        return self.n - self.m if o.causal_align == "bottom-right" else 0

    def rope_settings(self) -> tuple[float, int | None]:
        """RoPE's (base, rotary width): --rope-base and --rotary-dim, else the rope scaling mapping's
        rope_theta and partial_rotary_factor (transformers' rope_parameters carry both)."""
        o = self.options
        sc = o.rope_scaling or {}
        base = float(sc["rope_theta"]) if sc.get("rope_theta") is not None else o.rope_base
        part = sc.get("partial_rotary_factor")
        width = o.rotary_dim if o.rotary_dim is not None or part is None else int(self.d_qk * part)
        return base, width

    def slopes(self) -> np.ndarray | None:
        """The ALiBi slopes (H,): as given, or those of the ALiBi form for the head count (the paper's, or
        transformers' float32 ones for its absolute forms); None without ALiBi."""
        if self.alibi_slopes is not None:
            return self.alibi_slopes
        if not self.options.alibi:
            return None
        return ALIBI_FORMS[self.options.alibi_form].slopes(self.head_count)

    def where(self, name: str) -> str:
        """The file (or stdin / option) an array came from, for error messages."""
        return self.sources.get(name, "input")

    def origin(self, option: str) -> str:
        """Where the option ``option`` came from, for messages: what the caller recorded in ``sources`` as
        ``"option NAME"`` (a file's option, config.json), else its flag (``--rotary-dim``)."""
        return self.sources.get(f"option {option}", "--" + option.replace("_", "-"))


@dataclass(frozen=True)
class Problem(Shared):
    """Validated inputs (numpy, host), masks, labels, options and where each array came from: frozen.

    ``Problem.build`` is the one way in from outside: it checks and normalises what it is given (pure functions,
    nothing mutated) and constructs the value once. The constructor derives ``batch_shape``, ``axis_names``,
    ``kv_heads`` and ``query_limit`` from the other fields (so ``dataclasses.replace`` recomputes them and cannot
    patch them) and holds every array as a read-only view of what it was given: never a copy, so a memory-mapped
    input stays memory-mapped, and nothing downstream can write into a caller's array.

    ``q``, ``k``, ``v`` are always Q (..., m, d_q), K (..., n, d_k), V (..., n, d_v): (B, H, T, d) for
    the heads of a layer. Projections from X, Y, Z are their own part, :class:`attncli.core.layer.Layer`,
    whose projection step produces this problem (``Layer.problem(q, k, v)``).
    """

    q: np.ndarray  # (..., m, d_q)
    k: np.ndarray  # (..., n, d_k)
    v: np.ndarray  # (..., n, d_v)
    valid_lens: np.ndarray | None = None  # as given: (B,), (B, m), batch or batch + (m,)
    mask: np.ndarray | None = None  # bool or float, broadcastable to (..., m, n) (a layer's: (B, H, T, S))
    query_labels: list[str] | None = None
    key_labels: list[str] | None = None
    options: Options = field(default_factory=Options)
    score_weights: dict[str, np.ndarray] = field(default_factory=dict)  # the score's learned weights (W_q, w_v of additive)
    sources: dict[str, str] = field(default_factory=dict)
    padding: np.ndarray | None = None  # a layer's key padding (B, 1, 1, n), True = ignore (PyTorch); Layer only
    relative_bias: RelativeBias | None = None  # T5's per-head position bias: the bias step adds it
    sinks: np.ndarray | None = None  # (H,) one logit per query head (gpt-oss); --sinks, or the weights' sinks
    alibi_slopes: np.ndarray | None = None  # (H,) ALiBi slopes as given; None: the paper's (options.alibi)
    q_norm: np.ndarray | None = None  # QK-norm weights of q: (d,) shared, (H, d) per head (rms-full: (H, d) of
    k_norm: np.ndarray | None = None  # the H·d width); k: (d,) or (G, d). None: weightless (w = 1; rms1p: 1 + 0)
    q_norm_bias: np.ndarray | None = None  # LayerNorm QK-norm biases, shaped as the weights (Phi, Persimmon)
    k_norm_bias: np.ndarray | None = None

    # ---- facts about the inputs as given, found by build() ----
    batched: bool = True  # the input had a batch axis (a layer's steps drop it when not)
    result_dtype: str | None = None  # float16/bfloat16: every input came in it; computed in float32, cast back
    initialised: list[str] = field(default_factory=list)  # score weights drawn from --seed, not given

    # ---- derived: computed from the fields above by the constructor (never given, never patched) ----
    batch_shape: tuple[int, ...] = field(init=False, default=())  # leading axes of the attention arrays ((B, H))
    axis_names: tuple[str, ...] = field(init=False, default=())  # their names, for messages and views
    kv_heads: int | None = field(init=False, default=None)  # K/V heads when fewer than the query heads, else None
    query_limit: np.ndarray | None = field(init=False, default=None)  # (..., m): keys j >= limit are masked

    def __post_init__(self) -> None:
        seen: dict[int, Any] = {}  # one view per array: K that is Q stays Q (self-attention)
        for name in ARRAY_FIELDS:
            a = getattr(self, name)
            if a is not None:
                object.__setattr__(self, name, _read_only(a, seen))
        if self.score_weights:
            object.__setattr__(self, "score_weights", {n: _read_only(a, seen) for n, a in self.score_weights.items()})
        q, k, v = self.q, self.k, self.v
        G = grouped_heads(q.shape, k.shape, v.shape, self.where("k"), self.where("v"))
        kb, vb = (k.shape[:-3] + (int(q.shape[-3]),), v.shape[:-3] + (int(q.shape[-3]),)) if G else \
            (k.shape[:-2], v.shape[:-2])
        try:
            batch = tuple(np.broadcast_shapes(q.shape[:-2], kb, vb))
        except ValueError:
            raise self._fail("k", f"batch axes do not match: Q {q.shape}, K {k.shape}, V {v.shape} "
                                  "(leading axes must be equal or 1)") from None
        names = ("batch",) * len(batch)
        if len(batch) >= 2 and (q.ndim >= 4 or G):  # (B, H, T, d): axis -3 holds heads
            names = ("batch" if self.batched else "",) * (len(batch) - 1) + ("head",)
        elif len(batch) == 1 and (self.options.alibi or self.alibi_slopes is not None or self.sinks is not None):
            names = ("head",)  # (H, T, d) with ALiBi or sinks: axis -3 holds the heads their slopes and sinks follow
        for name, value in (("batch_shape", batch), ("kv_heads", G), ("axis_names", names)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "query_limit", self._valid_lens_limit())

    @property
    def m(self) -> int:
        return int(self.q.shape[-2])

    @property
    def n(self) -> int:
        return int(self.k.shape[-2])

    @property
    def d_qk(self) -> int:
        """The width of a query (per head): what √d scales by."""
        return int(self.q.shape[-1])

    @property
    def head_count(self) -> int:
        """Query heads: the axis -3 of Q (4-D (B, H, T, d) or 3-D (H, T, d)), or 1."""
        return int(self.q.shape[-3]) if self.q.ndim >= 3 else 1

    @property
    def self_attention(self) -> bool:
        """Q, K and V are one and the same matrix."""
        return self.k is self.q and self.v is self.k

    @property
    def dtype(self) -> str:
        """The dtype computed in: --dtype, else float32 when every input (and every given weight) is
        float32 or a half type, else float64. One rule for single- and multi-head attention (Layer.dtype)."""
        return computed_dtype(self.options, [self.q, self.k, self.v])

    def largest_input(self) -> float:
        return max(float(np.abs(a).max()) for a in (self.q, self.k))

    def _fail(self, name: str, message: str) -> InputError:
        return InputError(message, self.where(name))

    @classmethod
    def build(cls, q: Any, k: Any = None, v: Any = None, **kw: Any) -> Problem:
        """A validated, frozen Problem; k and v default to q (self-attention shorthand)."""
        k = q if k is None else k
        v = k if v is None else v
        sources = dict(kw.pop("sources", None) or {})
        o: Options = kw.get("options") or Options()

        def where(name: str) -> str:
            return sources.get(name, "input")

        halves = {half_type(a) for a in (q, k, v)}
        result_dtype = halves.pop() if len(halves) == 1 and not o.dtype else None
        k_is_q, v_is_k = k is q, v is k
        qa = _matrix("q", q, where("q"))
        ka = qa if k_is_q else _matrix("k", k, where("k"))
        va = ka if v_is_k else _matrix("v", v, where("v"))
        return cls._checked(qa, ka, va, sources, dict(kw, result_dtype=result_dtype))

    @classmethod
    def shaped(cls, q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], dtype: str, **kw: Any) -> Problem:
        """The problem of a layer's heads before its Q, K, V are computed: every mask, label, bias and
        option validated against their shapes (Q, K, V here: zeros of those shapes, no memory)."""
        zero = np.zeros((1,) * len(q), dtype)
        qa, ka, va = (np.broadcast_to(zero, s) for s in (q, k, v))
        return cls._checked(qa, ka, va, dict(kw.pop("sources", None) or {}), kw)

    @classmethod
    def _checked(cls, q: np.ndarray, k: np.ndarray, v: np.ndarray, sources: dict[str, str], kw: dict[str, Any]) -> Problem:
        """Every field checked and normalised from what it was given (nothing mutated), the value constructed
        once (its constructor derives the batch axes, the K/V heads and the valid lengths' limit, and checks
        them), then the checks that need those derived facts, on the frozen value."""
        o: Options = kw.get("options") or Options()
        score = get_score(o.score)

        def where(name: str) -> str:
            return sources.get(name, "input")

        if score.same_width and q.shape[-1] != k.shape[-1]:
            raise InputError(f"K has width {k.shape[-1]} but Q has width {q.shape[-1]}; --score {score.name} needs "
                             "equal widths (use --score additive for different widths)", where("k"))
        if k.shape[-2] != v.shape[-2]:
            raise InputError(f"V has {v.shape[-2]} rows but K has {k.shape[-2]} keys; each key needs one value row",
                             where("v"))
        if kw.get("padding") is not None:
            raise InputError("a key padding mask needs projections (attncli self); use --mask here", "--key-padding-mask")
        m, n, d = int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1])
        H = int(q.shape[-3]) if q.ndim >= 3 else 1
        G = int(k.shape[-3]) if k.ndim >= 3 else 1
        fields_ = dict(kw)
        for attr, count, what in (("query_labels", m, "queries"), ("key_labels", n, "keys")):
            fields_[attr] = _labels(kw.get(attr), attr, count, what, sources)
        if kw.get("mask") is not None:
            fields_["mask"] = mask_array(kw["mask"], "mask", where("mask"))
        fields_["score_weights"], fields_["initialised"] = prepare(score, dict(kw.get("score_weights") or {}), d,
                                                                   int(k.shape[-1]), o, where("weights"))
        if kw.get("alibi_slopes") is not None:
            a = heads.check_sinks(kw["alibi_slopes"], H, where("alibi_slopes"), "ALiBi slopes")
            if not np.isfinite(a).all():
                raise InputError("ALiBi slopes must be finite numbers", where("alibi_slopes"))
            fields_["alibi_slopes"] = a
        if kw.get("sinks") is not None:
            fields_["sinks"] = heads.check_sinks(kw["sinks"], H, where("sinks"))
        for name in ("q_norm", "k_norm", "q_norm_bias", "k_norm_bias"):
            if kw.get(name) is not None:
                fields_[name] = _qk_norm_weights(name, kw[name], o, H if name.startswith("q") else G, d, q.ndim,
                                                 sources.get(name, where("weights")))
        problem = cls(q, k, v, sources=sources, **fields_)
        problem._check_mask()
        if problem.relative_bias is not None:
            problem._check_relative_bias(problem.relative_bias)
        problem._check_today()
        return problem

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

    # ---- the checks that need the derived facts (batch axes, K/V heads): on the frozen value, reading only ----

    def _check_mask(self) -> None:
        if self.mask is None:
            return
        target = self.batch_shape + (self.m, self.n)
        try:
            full = np.broadcast_shapes(self.mask.shape, target)
        except ValueError:
            full = None
        if full != target:
            raise self._fail("mask", f"mask has shape {self.mask.shape}, which does not broadcast to the scores' shape "
                                     f"{target} (batch..., queries, keys)")

    def _check_relative_bias(self, rb: RelativeBias) -> None:
        """T5's table (num_buckets, H): one column per query head (its own step, bias, adds it)."""
        shape, H = np.shape(rb.table), self.head_count
        if len(shape) != 2 or shape[0] != rb.num_buckets or shape[1] not in (1, H):
            raise InputError(f"the relative position bias has shape {shape}; expected ({rb.num_buckets}, {H}): one "
                             f"column per query head", rb.origin or self.where("weights"))
        if shape[1] > 1 and "head" not in self.axis_names:
            raise InputError(f"the relative position bias has {shape[1]} heads but the problem has no head axis",
                             rb.origin or self.where("weights"))

    def _check_alibi_form(self) -> None:
        """ALiBi added before the scale (Falcon's) is divided here by the scale's reciprocal after the soft-cap: it
        needs a scale known from d and n, and no cap between."""
        o = self.options
        if not o.alibi_scaled:
            return
        rule = o.scaling or get_score(o.score).scaling
        if o.scale is None and rule not in CONSTANT_SCALINGS:
            raise InputError(f"ALiBi added before the scale needs a scale known from d and n; scaling {rule} (of the "
                             "scores themselves) is not", self.origin("alibi_scaled"))
        if o.softcap is not None:
            raise InputError(f"ALiBi added before the scale comes before the soft-cap too, while attncli caps "
                             f"({self.origin('softcap')}) before its bias step: give one of the two",
                             self.origin("alibi_scaled"))

    def _check_today(self) -> None:
        """The options of today's models against the shapes: RoPE widths, positions that mean something,
        the K/V heads option, the query offset against the causal alignment."""
        o, score = self.options, get_score(self.options.score).name
        H, d = self.head_count, self.d_qk
        if o.kv_heads is not None and o.kv_heads != (self.kv_heads or H):
            raise InputError(f"K and V have {self.kv_heads or H} heads on axis -3 (Q has {H}); K/V heads {o.kv_heads} "
                             "does not match them", self.origin("kv_heads"))
        if o.rope is not None:
            heads.check_positional(score, "rope")
            sc = dict(o.rope_scaling or {})
            theta, part = sc.get("rope_theta"), sc.get("partial_rotary_factor")
            if theta is not None and o.rope_base != Options().rope_base and float(theta) != o.rope_base:
                raise InputError(f"rope_theta {theta:g} in the rope scaling differs from the RoPE base {o.rope_base:g} "
                                 f"({self.origin('rope_base')}); give one of the two", self.origin("rope_scaling"))
            if part is not None and o.rotary_dim is not None and int(d * part) != o.rotary_dim:
                raise InputError(f"partial_rotary_factor {part:g} of head width {d} is {int(d * part)} features, but "
                                 f"the rotary width is {o.rotary_dim} ({self.origin('rotary_dim')}); give one of the two",
                                 self.origin("rope_scaling"))
            width = self.rope_settings()[1]
            heads.check_rope(d, width, o.rope, self.origin("rotary_dim" if o.rotary_dim is not None else "rope_scaling"),
                             self.origin("rope"))
        elif o.rotary_dim is not None:
            raise InputError("applies to rotary position embeddings: add --rope half or --rope interleaved",
                             self.origin("rotary_dim"))
        elif o.rope_scaling is not None:
            raise InputError("applies to rotary position embeddings: add --rope half or --rope interleaved",
                             self.origin("rope_scaling"))
        if o.alibi or self.alibi_slopes is not None:
            heads.check_positional(score, "alibi")
            self._check_alibi_form()
        elif o.alibi_form != Options().alibi_form or o.alibi_scaled:
            raise InputError("applies to ALiBi: add --alibi (or --alibi-slopes)",
                             self.origin("alibi_scaled" if o.alibi_scaled else "alibi_form"))
        positional = o.causal or o.window is not None or o.chunk is not None or o.local_window is not None
        if o.q_offset is not None and o.causal_align == "bottom-right" and positional and o.q_offset != self.n - self.m:
            raise InputError(f"--q-offset {o.q_offset} with --causal-align bottom-right: bottom-right puts the {self.m} "
                             f"queries last among the {self.n} keys, at offset {self.n - self.m}; give one of the two",
                             "--q-offset")


ARRAY_FIELDS = ("q", "k", "v", "valid_lens", "mask", "padding", "sinks", "alibi_slopes", "q_norm", "k_norm",
                "q_norm_bias", "k_norm_bias")


def _read_only(a: Any, seen: dict[int, Any]) -> Any:
    """A numpy array as a read-only view of itself (a view, never a copy: a memory-mapped input stays memory-mapped);
    the same view for the same array (K that is Q). Anything else (a list of valid lengths) as it is."""
    if not isinstance(a, np.ndarray):
        return a
    if id(a) in seen:
        return seen[id(a)]
    if a.flags.writeable:
        view = a.view()
        view.flags.writeable = False
    else:
        view = a
    seen[id(a)] = view
    return view


def grouped_heads(qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], where_k: str = "input",
                  where_v: str = "input") -> int | None:
    """The grouped-query rule, once: K/V heads G when K and V have fewer heads than Q on axis -3 (query head h reads
    K/V head h // (H / G)), else None. A 3-D (B, T, d) has batch axes, no heads, unless G divides H; a 4-D K with one
    head is multi-query when V has one too. Refuses a G that does not divide H, and V with other heads than K."""
    if len(qs) < 3 or len(ks) < 3 or len(ks) > len(qs):
        return None
    H, G = int(qs[-3]), int(ks[-3])
    if G == H or (G == 1 and len(qs) < 4) or (len(qs) == 3 and H % G):
        return None
    if G == 1 and (len(vs) < 3 or int(vs[-3]) != 1):
        return None
    heads.check_kv_heads(H, G, where_k)
    if len(vs) < 3 or int(vs[-3]) != G:
        raise InputError(f"V has shape {tuple(vs)} but K has {G} heads (axis -3): K and V need the same heads", where_v)
    return G


def _matrix(name: str, a: Any, where: str) -> np.ndarray:
    title = ARRAY_TITLES[name]
    a = numeric_array(a, title, where)
    if a.ndim == 0:
        raise InputError(f"{title} is a single number; expected a vector or a matrix (..., rows, width)", where)
    if a.ndim == 1:
        a = a[None, :]  # a 1-D q is one query (and a 1-D k or v one key)
    if a.size == 0:
        raise InputError(f"{title} is empty (shape {a.shape})", where)
    return a


def _labels(given: Any, attr: str, count: int, what: str, sources: dict[str, str]) -> list[str] | None:
    if given is None:
        return None
    labels = [printable(str(x)) for x in check.labels(cut_labels(given), sources.get(attr, attr)) or []]
    if len(labels) != count:
        raise InputError(f"{len(labels)} {attr.replace('_', ' ')} given for {count} {what}",
                         sources.get(attr, f"--{attr.replace('_', '-')}"))
    return labels


def _qk_norm_weights(name: str, w: Any, o: Options, H: int, d: int, q_ndim: int, where: str) -> np.ndarray:
    """QK-norm weights and biases: (d,) shared by the heads, or one row per head ((H, d) for q, (G, d) for k);
    rms-full's cover a token's every head, (H·d,) (held (H, d)); a bias only with layernorm."""
    if o.qk_norm is None:
        raise InputError(f"holds {name} weights (QK-norm): say which norm with --qk-norm (rms: Qwen3, rms1p: "
                         "Gemma 3, layernorm: StableLM/Cohere, rms-full: OLMo 2)", where)
    if name.endswith("_bias") and o.qk_norm != "layernorm":
        raise InputError(f"holds {name} (a bias of the QK-norm), which only --qk-norm layernorm adds; "
                         f"--qk-norm {o.qk_norm} has none", where)
    w = numeric_array(w, name, where)
    shape = np.shape(w)
    if o.qk_norm == "rms-full":
        if shape not in ((H * d,), (H, d)):
            raise InputError(f"{name} has shape {shape}; --qk-norm rms-full normalises the {H}·{d} features "
                             f"of every head of a token together: expected ({H * d},)", where)
        return w.reshape(H, d)
    if w.ndim == 2 and shape[0] == 1 and shape[1] == d:
        return w.reshape(d)
    if shape != (d,) and (shape != (H, d) or q_ndim < 3):
        raise InputError(f"{name} has shape {shape}; QK-norm {o.qk_norm} normalises each head's {d} "
                         f"features: expected ({d},) shared by the heads or ({H}, {d}), one row per "
                         f"{'query' if name.startswith('q') else 'K/V'} head", where)
    return w


def computed_dtype(o: Options, every: list[np.ndarray]) -> str:
    """--dtype, else float32 when every array is float32 or a half type, else float64."""
    if o.dtype:
        return o.dtype
    return "float32" if all(a.dtype in (np.float32, np.float16) or half_type(a) for a in every) else "float64"
