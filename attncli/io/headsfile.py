"""Statistics files of ``attncli heads --save``: what a run measured, as sums that merge exactly.

    {"format": "attncli-heads/1", "definitions_version": ..., "definitions": {...}, "thresholds": {...},
     "model": {"config_sha256": ..., "weights_sha256": ..., "model_type": ...},   # never the model's path
     "settings": {"exclude_first": ..., "exclude_self": ..., "probe": ...},
     "layers": [0, 1, ...], "heads": H, "inputs": [sha256 of each input, ...],
     "statistics": [{"layer", "head", "<stat>": {"mean", "n", "std", "n_inputs"}, ..., "patterns"}, ...],
     "sums": {"total", "count", "input_sum", "input_sq", "inputs"}: (layers, heads, statistics) nested lists}

The model is named by the SHA-256 of its config.json and of its weights' headers (every tensor's name, dtype and
shape), so files made on different machines merge when, and only when, they measured the same model.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from attncli.core import headstats as hs
from attncli.errors import InputError

FORMAT = "attncli-heads/1"
SUM_FIELDS = ("total", "count", "input_sum", "input_sq", "inputs")
MATCH = ("definitions_version", "model", "layers", "heads", "thresholds", "settings", "statistics_names")


def model_identity(spec: str) -> dict[str, Any]:
    """The SHA-256 of a model's config.json and of its weights' headers (names, shapes, dtypes), and its model_type:
    the digests a capture's provenance holds (attncli.io.capture), so a capture and a statistics file name a model
    alike."""
    from attncli.io.capture import config_digest, headers_digest
    from attncli.io.checkpoint import open_checkpoint

    ck = open_checkpoint(spec)
    cfg = None if ck.config_path is None else config_digest(ck.config_path)[0]
    return {"config_sha256": cfg, "weights_sha256": headers_digest(spec),
            "model_type": (ck.config or {}).get("model_type")}


def input_hash(*arrays: Any) -> str:
    """A SHA-256 of one input: each array's dtype, shape and bytes (None for absent)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none;")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def document(sums: hs.Sums, *, layers: list[int], heads: int, model: dict[str, Any], thresholds: dict[str, float],
             settings: dict[str, Any], inputs: list[str], with_sums: bool) -> dict[str, Any]:
    """The JSON object of a run (``with_sums``: the --save file, which merges)."""
    mean, spread = sums.mean(), sums.spread()
    rows = []
    for li, layer in enumerate(layers):
        for h in range(heads):
            row: dict[str, Any] = {"layer": layer, "head": h}
            means: dict[str, float | None] = {}
            for k, name in enumerate(hs.STATS):
                n = int(sums.count[li, h, k])
                v = None if n == 0 else float(mean[li, h, k])
                means[name] = v
                sd = float(spread[li, h, k]) if n and sums.inputs[li, h, k] > 0 else None
                row[name] = {"mean": v, "n": n, "std": sd, "n_inputs": int(sums.inputs[li, h, k])}
            row["patterns"] = hs.patterns(means, thresholds)
            rows.append(row)
    doc: dict[str, Any] = {
        "format": FORMAT, "definitions_version": hs.DEFINITIONS_VERSION,
        "definitions": {n: {"formula": f, "count": c} for n, (f, c) in hs.DEFINITIONS.items()},
        "thresholds": {p: {"statistic": hs.PATTERNS[p][0], "at_least": t, "origin": hs.PATTERNS[p][2]}
                       for p, t in thresholds.items()},
        "spread": "std: the standard deviation across inputs of each input's mean (ddof 0)",
        "model": model, "settings": settings, "layers": layers, "heads": heads, "inputs": inputs,
        "statistics_names": list(hs.STATS), "statistics": rows,
    }
    if with_sums:
        doc["sums"] = {f: getattr(sums, f).tolist() for f in SUM_FIELDS}
    return doc


def _limits(doc: dict[str, Any]) -> dict[str, float]:
    return {p: float(v["at_least"]) for p, v in doc["thresholds"].items()}


def read(path: str, content: Any) -> tuple[dict[str, Any], hs.Sums]:
    """A statistics file checked: its format, definitions' version, sums of the right shape, counts whole and not
    negative, sums finite; else one line naming the file and what is wrong."""
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise InputError(f"is not a statistics file of attncli heads --save (no \"format\": \"{FORMAT}\")", path)
    if content.get("definitions_version") != hs.DEFINITIONS_VERSION:
        raise InputError(f"holds statistics of definitions {content.get('definitions_version')!r}; this attncli "
                         f"measures {hs.DEFINITIONS_VERSION!r}", path)
    for key in ("model", "layers", "heads", "thresholds", "settings", "inputs", "sums", "statistics_names"):
        if key not in content:
            raise InputError(f"has no {key!r}", path)
    if content["statistics_names"] != list(hs.STATS):
        raise InputError("measured other statistics than this attncli's", path)
    layers, heads = content["layers"], content["heads"]
    if not (isinstance(layers, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
            and isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1):
        raise InputError("'layers' must be a list of layer numbers and 'heads' a positive whole number", path)
    if not (isinstance(content["inputs"], list) and all(isinstance(x, str) for x in content["inputs"])):
        raise InputError("'inputs' must be a list of input hashes", path)
    try:
        _limits(content)
    except (TypeError, KeyError, ValueError, AttributeError):
        raise InputError("'thresholds' must map each pattern to {\"at_least\": number}", path) from None
    raw = content["sums"]
    if not isinstance(raw, dict):
        raise InputError("'sums' must be a mapping", path)
    shape = (len(layers), heads, hs.S)
    arrays = {}
    for f in SUM_FIELDS:
        try:
            a = np.asarray(raw.get(f), dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"sums.{f} holds something other than numbers", path) from None
        if a.shape != shape:
            raise InputError(f"sums.{f} has shape {a.shape}; expected {shape} (layers, heads, statistics)", path)
        if not np.isfinite(a).all():
            raise InputError(f"sums.{f} holds NaN or an infinity", path)
        if f in ("count", "inputs"):
            if (a < 0).any():
                raise InputError(f"sums.{f} holds a negative count", path)
            if (a != np.round(a)).any():
                raise InputError(f"sums.{f} holds a count that is not a whole number", path)
            a = a.astype(np.int64)
        elif f == "input_sq" and (a < 0).any():
            raise InputError("sums.input_sq holds a negative sum of squares", path)
        arrays[f] = a
    if ((arrays["count"] == 0) & (arrays["total"] != 0)).any():
        raise InputError("sums.total is not 0 where its count is 0", path)
    return content, hs.Sums(**arrays)


def merge(files: list[tuple[str, dict[str, Any], hs.Sums]]) -> tuple[dict[str, Any], hs.Sums, list[str]]:
    """The union of statistics files that measured the same model, layers, definitions, thresholds and settings,
    each input once: (the first file's facts, the summed sums, every input hash)."""
    first_path, first, total = files[0]
    seen: dict[str, str] = {h: first_path for h in first["inputs"]}
    inputs = list(first["inputs"])
    for path, doc, sums in files[1:]:
        for key in MATCH:
            if doc.get(key) != first.get(key):
                what = {"model": "another model (config.json or weights' headers differ)",
                        "definitions_version": "other definitions"}.get(key, f"other {key}")
                raise InputError(f"measured {what} than {first_path}; only like statistics merge", path)
        for h in doc["inputs"]:
            if h in seen:
                raise InputError(f"measured an input that {seen[h]} measured too (hash {h[:12]}…); each input "
                                 "merges once", path)
            seen[h] = path
        inputs.extend(doc["inputs"])
        total = total.merged(sums)
    return first, total, inputs


def limits_of(doc: dict[str, Any]) -> dict[str, float]:
    """The thresholds a file was named with."""
    return _limits(doc)


def finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x
