"""A recomputed layer against the model's own attention weights (a capture holds them): agree or not.

    a = model_attention(problem, trace, own, valid, layer=5, dtype="float32", family="llama")
    a.agrees, a.max_abs_diff, a.bound
    a.line()   # 'layer 5: agrees with the model's own attention, max |Δ| 3.1e-07 over 8 heads × 12 × 12'

Like with like: the weights that multiplied V (trace ``weights``) against the weights the model's module returned,
over valid queries and keys only (padding left out). Judged as ``attncli check`` judges numbers of that dtype
(:func:`attncli.check.verdict.default_judgement`): float32 by torch.testing's float32 tolerance, bfloat16 and
float16 against the error of plain arithmetic in that dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attncli.check.verdict import check, default_judgement
from attncli.errors import InputError

HALVES = ("bfloat16", "float16")


@dataclass(frozen=True)
class Agreement:
    """How a recomputed layer's weights compare with the model's own."""

    layer: int
    max_abs_diff: float
    bound: float
    agrees: bool
    heads: int
    queries: int
    keys: int
    family: str
    rule: str  # how the bound was set
    verdict: Any = field(default=None, compare=False, repr=False)  # check's own Verdict on these weights

    def line(self) -> str:
        what = "agrees with" if self.agrees else "DIFFERS from"
        return (f"layer {self.layer}: {what} the model's own attention, max |Δ| {self.max_abs_diff:.1e} over "
                f"{self.heads} heads × {self.queries} × {self.keys}"
                + ("" if self.agrees else f" (bound {self.bound:.1e}, {self.family})"))

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "max_abs_diff": self.max_abs_diff, "bound": self.bound, "agrees": self.agrees,
                "rule": self.rule}


def model_attention(problem: Any, trace: Any, own: np.ndarray, valid: tuple[Any, Any], *, layer: int, dtype: str,
                    family: str, source: str = "capture") -> Agreement:
    """Compare ``trace``'s weights (B, H, m, n) with the model's own ``own`` (B, H, m, n) where ``valid`` (B, m) and
    (B, n) are real tokens (self-attention: one (B, T) mask for both; cross-attention: a pair)."""
    computed = np.asarray(trace.weights, dtype=np.float64)
    own = np.asarray(own, dtype=np.float64)
    if computed.ndim == 3:
        computed = computed[None]
    if own.shape != computed.shape:
        raise InputError(f"holds the model's attention of layer {layer} in shape {own.shape}, but the layer computes "
                         f"{computed.shape}", source)
    vq, vk = valid
    cells = np.asarray(vq, bool)[:, None, :, None] & np.asarray(vk, bool)[:, None, None, :]
    cells = np.broadcast_to(cells, computed.shape)
    diff = np.where(cells, np.abs(own - computed), 0.0)
    worst = float(diff.max()) if diff.size else 0.0
    expected = np.where(cells, own, computed)  # padding: not compared (equal by construction)
    half = dtype if dtype in HALVES else None
    tol, precision, precision_source = default_judgement(expected.astype(np.float32), None, half, str(trace.meta.dtype),
                                                         source)
    verdict = check(problem, expected, what="weights", tolerance=tol, trace=trace, source=source, explain=False,
                    precision=precision, precision_source=precision_source, pairs=False)
    if verdict.precision is not None:  # judged against attncli's float64 reference, as check does
        worst = verdict.precision.max_abs_error
        bound = float(verdict.tolerance.atol)
        rule = verdict.tolerance.origin
    else:
        bound = float(tol.atol + tol.rtol * np.abs(computed).max()) if computed.size else tol.atol
        rule = tol.origin
    shown = own.shape
    return Agreement(layer, worst, float(bound), bool(verdict.match), int(shown[1]), int(np.asarray(vq).sum(axis=1).max()),
                     int(np.asarray(vk).sum(axis=1).max()), family, rule, verdict)
