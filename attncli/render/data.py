"""Machine formats: JSON (stdout or file) and NPZ (stdout or file)."""

from __future__ import annotations

import io
import json
import math
from typing import IO, Any

import numpy as np

from attncli import __version__
from attncli.core.trace import Trace
from attncli.errors import InputError
from attncli.render import RenderOptions, output_format, saver


def _plain(a: Any) -> Any:
    """Nested lists of Python floats (full precision); non-finite values become null."""
    arr = np.asarray(a)
    if arr.dtype == bool:
        return arr.tolist()
    if arr.dtype.kind in "iu":
        return arr.tolist()
    flat = [None if not math.isfinite(x) else x for x in arr.astype(np.float64).ravel().tolist()]
    if arr.ndim == 0:
        return flat[0]
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _finite(obj: Any) -> Any:
    """``obj`` (a value of the trace's meta or extra: numbers, lists, mappings, arrays) with every
    non-finite number as null, the JSON spelling of the steps' values (e.g. a sink of -inf: no sink)."""
    if isinstance(obj, float) or isinstance(obj, np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "fc":
        return _plain(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def trace_dict(trace: Trace, opts: RenderOptions) -> dict[str, Any]:
    """The JSON document: ``weights``, ``output``, ``steps`` (name, formula, shape, values), ..."""
    names = opts.steps
    steps = [s for s in trace.steps if names is None or s.name in names]
    doc: dict[str, Any] = {
        "attncli": __version__,
        **_finite(trace.meta.to_dict()),
        "labels": {"queries": trace.query_labels, "keys": trace.key_labels},
        "steps": [{"name": s.name, "formula": s.formula, "axes": list(s.axes), "shape": list(np.shape(s.values)),
                   "values": _plain(s.numpy()), **({"notes": s.notes} if s.notes else {})} for s in steps],
    }
    for key in ("weights", "output"):
        if key in trace:
            doc[key] = _plain(trace[key])
    doc["warnings"] = list(trace.warnings)
    doc.update(_finite(trace.extra))
    return doc


def dumps(trace: Trace, opts: RenderOptions) -> str:
    return json.dumps(trace_dict(trace, opts), ensure_ascii=False, allow_nan=False)


@output_format("json")
def print_json(trace: Trace, opts: RenderOptions, out: Any) -> None:
    out.write(dumps(trace, opts) + "\n")


@saver(".json")
def save_json(trace: Trace, opts: RenderOptions, f: IO[bytes]) -> None:
    f.write((dumps(trace, opts) + "\n").encode())


def npz_arrays(trace: Trace, opts: RenderOptions) -> dict[str, np.ndarray]:
    arrays = {k: v for k, v in trace.arrays().items() if opts.steps is None or k in opts.steps}
    arrays.update({k: np.asarray(v) for k, v in trace.inputs_numpy().items() if k not in arrays})
    for name, labels in (("query_labels", trace.query_labels), ("key_labels", trace.key_labels)):
        if labels is not None:
            arrays[name] = np.asarray(labels, dtype=str)
    return arrays


@saver(".npz")
def save_npz(trace: Trace, opts: RenderOptions, f: IO[bytes]) -> None:
    np.savez(f, **npz_arrays(trace, opts))  # type: ignore[arg-type]


@saver(".npy")
def save_npy(trace: Trace, opts: RenderOptions, f: IO[bytes]) -> None:
    """One array: the output, or the one step named by --steps. Written in chunks (no copy in memory)."""
    names = [s for s in (opts.steps or []) if s != "output"]
    if len(names) > 1 or (names and len(set(opts.steps or [])) > 1):
        raise InputError(f"an .npy file holds one array, but --steps names {', '.join(opts.steps or [])}; "
                         "save several steps as .npz", "--save")
    name = names[0] if names else "output"
    a = trace.inputs_numpy()[name] if name in trace.inputs and name not in trace else trace[name]
    np.lib.format.write_array(f, np.asarray(a), allow_pickle=False)


@output_format("npz")
def print_npz(trace: Trace, opts: RenderOptions, out: Any) -> None:
    buf = io.BytesIO()
    save_npz(trace, opts, buf)
    out.buffer.write(buf.getvalue()) if hasattr(out, "buffer") else out.write(buf.getvalue())
