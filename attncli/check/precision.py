"""Attention as a plain implementation in a low precision computes it: the error rounding alone explains.

    naive = naive_run(problem, "bfloat16")     # the SAME pipeline (attncli.core.engine.run), on arrays
                                               # whose every operation is rounded to bfloat16

A kernel or a port in bfloat16 cannot match a float64 reference to float64 precision, and a
tolerance loosened by hand until it passes lets real bugs through too. FlashAttention's
authors judge a kernel's error against a float32/64 reference *relative to* the error of a
standard implementation in the same precision (their tests: ``max |out - ref| <= 2 · max
|out_plain - ref|``). ``check --precision-of`` does the same; this module computes
``out_plain``.

The plain implementation is PyTorch eager on the CPU in that dtype, emulated on numpy: the
inputs are rounded to the dtype, and every operation of the pipeline's stages (each
product, sum, max, exp, division, projection) is computed in float32 and its result
rounded back to the dtype, as torch does for ``bfloat16``/``float16`` tensors (float32
accumulation inside matmuls, one rounding per operation). Where torch and transformers' modules
compute several operations at once, the emulation does too (:class:`RoundingNamespace`): a
projection with a bias is ``F.linear`` (the bias added in the float32 accumulator, one rounding),
the softmax is torch's (s - max, exp, the sum and the division in float32, one rounding), RoPE's
cos and sin are held in the dtype (``cos.to(x.dtype)``) and q, k rotated as the family does (the
option ``rope_rounding``: every operation rounded, Llama; in float32 and rounded once, Cohere,
ESM, ModernBERT, or with float32 tables too, OLMo 2, Ernie 4.5, LFM3), a sink enters as the
family has it (``sink_form``: gpt-oss's logit, Granite SWA's scale), and the norms (RMSNorm,
LayerNorm, QK-norms) are computed in float32 and rounded once, the RMSNorm's weight applied after
that rounding (Llama) or before it where the family does (``rms_wide``: GPT-OSS, Helium, OLMo 2).
Each family fact was read off the family's own modules run in float16
(tests/test_check_families.py, tests/test_check_today.py). On transformers' own Llama layer
(RMSNorm, RoPE, grouped heads, biases) in bfloat16 and float16 the emulated output is the
module's, cell for cell (tests/test_check_today.py);
before the bias, softmax and RMSNorm-weight roundings were followed (the float16 false alarms of
gpt_oss and helium at seed 3, docs/false_alarms.md) it only had an error of the module's size.
No second attention is written: :class:`Rounded` is an ndarray whose ufuncs round their results, and
the engine runs its stages on it. float32 and float64 run as plain numpy arrays of that type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from attncli.core import ops
from attncli.core.backend import PRECISIONS, Backend, numpy_namespace, round_bfloat16
from attncli.core.engine import run
from attncli.core.layer import Subject
from attncli.core.plan import Plan
from attncli.core.trace import Trace
from attncli.errors import InputError

HALF = ("bfloat16", "float16")
# the bound FlashAttention's tests use: a kernel's largest error at most twice the plain one's
FACTOR = 2.0
# ...and a row's RMS error at most this many times the plain RMS error in that row (or its median row): an RMS over
# one row's few cells varies more from one implementation to another (a real float16/bfloat16 layer's rows reach
# 3× the plain implementation's), while a wrong row is off by far more than rounding
ROW_FACTOR = 4.0
# ...and each head's RMS error (a multi-head output's error traced back through W_o) at most this many times the
# plain implementation's in that head (or its median head): a head computed wrong, a little, in every row
HEAD_FACTOR = 3.0
# ...traced back through W_o⁺ without the directions W_o shrinks below this fraction of its largest gain (there the
# output's own rounding, divided by a tiny gain, outweighs everything: attncli.check.verdict.through_heads)
HEAD_RCOND = 0.05
# ...and no head's output off by a factor 1 + α (fitted in output space, attncli.check.verdict._scaled_heads): |α|
# more than this many times the scale plain rounding gives that head (tests/test_check_families.py, 72 families, seed 0:
# own bfloat16 and float16 outputs stay within 3.3×; a head 2% off stands 7-70× out in bfloat16, 70-500× in float16),
# and more than 0.5% (2.5 units of bfloat16 rounding; float32's own outputs reach 5× with |α| ~ 1e-7)
SCALED_HEAD_Z, SCALED_HEAD_MIN = 5.0, 0.005
# torch.testing.assert_close's atol by dtype: the least tolerance allowed when the plain error is ~0
FLOOR = {"bfloat16": 1e-5, "float16": 1e-5, "float32": 1e-5, "float64": 1e-7}


def _round_float16(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond 65504: inf, as float16 arithmetic gives
        return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


ROUNDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"bfloat16": round_bfloat16, "float16": _round_float16}


def check_precision(name: str, source: str = "--precision-of") -> str:
    if name not in PRECISIONS:
        raise InputError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}", source)
    return name


class Rounded(np.ndarray):
    """float32 values of a lower precision: every ufunc (arithmetic, ``@``, reductions) is computed
    in float32 and its result rounded to ``dtype_name``; functions such as ``where`` keep the class."""

    dtype_name = "bfloat16"

    @classmethod
    def of(cls, a: Any) -> Rounded:
        return _wrap(cls, np.asarray(a, dtype=np.float32))

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        cls = type(self)
        args = [x.view(np.ndarray) if isinstance(x, Rounded) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(x.view(np.ndarray) if isinstance(x, Rounded) else x for x in kwargs["out"])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            result = getattr(ufunc, method)(*args, **kwargs)
        if method == "reduce" and ufunc is np.add:
            return result  # a sum stays in its float32 accumulator, as inside torch's fused softmax
        return _rewrap(cls, result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        plain = tuple(t for t in types if not issubclass(t, Rounded)) + (np.ndarray,)
        result = super().__array_function__(func, plain, _unwrap(args), _unwrap(kwargs))
        if func is np.sum:
            return result  # the float32 accumulator, unrounded (see __array_ufunc__)
        return _rewrap(type(self), result)


def _unwrap(x: Any) -> Any:
    if isinstance(x, Rounded):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(y) for y in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(cls: type[Rounded], a: np.ndarray) -> Rounded:
    return ROUNDERS[cls.dtype_name](a).view(cls)


def _rewrap(cls: type[Rounded], result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_rewrap(cls, r) for r in result)
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        return _wrap(cls, result.astype(np.float32, copy=False))
    if isinstance(result, np.floating):
        return _wrap(cls, np.asarray(result, dtype=np.float32))
    return result


ROUNDED: dict[str, type[Rounded]] = {
    name: type(f"Rounded_{name}", (Rounded,), {"dtype_name": name, "__module__": __name__}) for name in HALF}


def rounded(a: Any, dtype: str) -> Any:
    """``a`` as the plain computation in ``dtype`` holds it: a :class:`Rounded` array for a half type,
    else a numpy array of ``dtype``."""
    if dtype in ROUNDED:
        return ROUNDED[dtype].of(a)
    return np.asarray(a, dtype=dtype)


class _Wide:
    """:class:`RoundingNamespace`'s ``float32``: the width the norms compute a half-precision input in (unrounded)."""

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return "float32 (unrounded)"


WIDE = _Wide()


class RoundingNamespace:
    """numpy as the emulation's array namespace, where the plain implementation holds every tensor in the precision:

    - ``asarray`` of floats gives a :class:`Rounded` array: a table the stages move onto the backend themselves
      (RoPE's cos and sin, a fill value, sinks) is held in the precision. transformers' rotary embeddings return
      ``cos.to(x.dtype), sin.to(x.dtype)``: in bfloat16 a rotation by rounded cos and sin, an error of up to 2⁻⁹
      of q and k, the same in every head at a position;
    - ``float32`` is :data:`WIDE`, so the norms (attncli.core.ops.rms_norm, layer_norm) take their half-precision
      branch: ``astype(x, float32)`` widens to plain float32 (unrounded arithmetic) and the cast back
      (``astype(y, x.dtype)``) rounds once, as transformers' RMSNorm (float32, then ``.to(input_dtype)``, then
      ``weight *`` it, rounded) and torch's LayerNorm kernel (float32 throughout, weight and bias included, one
      rounding) compute.

    Before, both were missed (cos and sin unrounded; every operation of a norm rounded, the mean of x² too: a scale
    error shared by a whole row, and a LayerNorm's product with w rounded before adding b): the module's error in
    a row differed from the emulation's by up to 3.5×, the false alarms of tests/test_check_families.py (minimax
    bfloat16 layer 0: its row 2 had 2.2× the emulation's RMS error; with float32 cos/sin in the module, 1.0×).
    Measured against transformers' own bfloat16 Llama layer (tests/test_check_today.py): the same normed input
    and rotated q, bit for bit."""

    float32 = WIDE

    def __init__(self, precision: str) -> None:
        self.precision = precision

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def _held(self, r: np.ndarray) -> Any:
        return ROUNDED[self.precision].of(r) if r.dtype.kind == "f" else r

    def asarray(self, a: Any, dtype: Any = None, device: Any = None, copy: bool | None = None) -> Any:
        if dtype is WIDE:
            return np.asarray(_unwrap(a), dtype=np.float32)
        return self._held(np.asarray(_unwrap(a), dtype=dtype))

    def astype(self, a: Any, dtype: Any, copy: bool = True) -> Any:
        if dtype is WIDE:  # x.to(float32): computed unrounded from here
            return np.array(_unwrap(a), dtype=np.float32)
        return self._held(np.asarray(_unwrap(a), dtype=dtype))  # .to(dtype): rounded once

    def fused_linear(self, x: Any, w: Any, b: Any = None) -> Any:
        """``F.linear``: x @ W + b in float32 (the bias added in the product's accumulator), rounded once."""
        y = np.asarray(_unwrap(x), dtype=np.float32) @ np.asarray(_unwrap(w), dtype=np.float32)
        return self._held(y if b is None else y + np.asarray(_unwrap(b), dtype=np.float32))

    def fused_softmax(self, s: Any) -> Any:
        """torch's softmax of a half tensor: s - max, exp, the sum and the division in float32, rounded once."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self._held(ops.softmax(np, np.asarray(_unwrap(s), dtype=np.float32)))


def naive_backend(precision: str) -> Backend:
    """numpy whose float arrays are held in ``precision`` (see the module docstring)."""
    xp = RoundingNamespace(precision) if precision in ROUNDED else numpy_namespace()
    return Backend("numpy", xp, None, functools.partial(rounded, dtype=precision))


def naive_run(problem: Subject, precision: str) -> Trace:
    """Every stage of ``problem`` (numpy, the explicit path) as a plain implementation in ``precision``:
    a Trace whose steps are float64 arrays holding that precision's numbers."""
    o = replace(problem.options, backend="numpy", device="cpu", dtype="float32" if precision != "float64" else "float64",
                keep_weights=True)
    p = replace(problem, options=o, result_dtype=None)
    trace = run(p, Plan("explicit"), naive_backend(precision))
    for step in trace.steps:
        step.values = np.asarray(step.values, dtype=np.float64)
    return trace


def naive_step(problem: Subject, precision: str, what: str, cells: int = 1 << 22) -> np.ndarray:
    """Step ``what`` of :func:`naive_run`; the output of a large problem is computed in blocks of query rows (each
    row against every key: the same numbers), so no (m, n) matrix of the whole problem is held."""
    total = int(np.prod(problem.batch_shape)) * problem.m * problem.n
    if what != "output" or total <= cells:
        return naive_run(problem, precision)[what]
    o = replace(problem.options, backend="numpy", device="cpu", dtype="float32" if precision != "float64" else "float64",
                keep_weights=True)
    p = replace(problem, options=o, result_dtype=None)
    step = max(1, cells // max(1, int(np.prod(problem.batch_shape)) * problem.n))
    parts = [np.asarray(run(p, Plan("explicit", tuple(range(i, min(p.m, i + step)))), naive_backend(precision))[what],
                        dtype=np.float64) for i in range(0, p.m, step)]
    return np.concatenate(parts, axis=-2)


def softmax_in(xp_softmax: Callable[[Any, Any], Any], s: np.ndarray, precision: str) -> np.ndarray:
    """``xp_softmax(numpy, s)`` computed in ``precision`` (its inputs rounded, every operation too), as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(xp_softmax(numpy_namespace(), rounded(s, precision)), dtype=np.float64)
