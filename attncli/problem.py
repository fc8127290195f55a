"""Problem: validated inputs and options. The one place for shape checks and their messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.arrays import mask_array, numeric_array, printable
from attncli.backend import half_type
from attncli.errors import InputError
from attncli.options import CAUSAL_ALIGNS, MASK_CONVENTIONS, Options
from attncli.scoring import get_score
from attncli.weights import prepare

__all__ = ["ARRAY_TITLES", "CAUSAL_ALIGNS", "MASK_CONVENTIONS", "Options", "Problem", "mask_array", "numeric_array",
           "printable"]

ARRAY_TITLES = {"q": "Q", "k": "K", "v": "V", "valid_lens": "valid lengths", "mask": "mask"}


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
        score = get_score(o.score)

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
        self.params, self.initialised = prepare(score, self.params, int(q.shape[-1]), int(k.shape[-1]), o,
                                                self.where("weights"))

    # ---- pieces of validate ----

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
            labels = [printable(str(x)) for x in labels]
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
