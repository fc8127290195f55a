"""The projection weights of one attention module as a weights file names them (a .npz/.yaml/.json
mapping or a PyTorch state dict, read into memory), converted to the textbook convention
``Q = X @ W_q`` with a note of where each came from.

    textbook   W_q, W_k, W_v (W_o, b_q, b_k, b_v, b_o) with Q = X @ W_q      as given
    d2l        nn.Linear layers W_q, W_k, W_v, W_o                          (out, in): transposed
    notes      nn.Linear layers q, k, v (o)                                 (out, in): transposed
    mha        nn.MultiheadAttention: in_proj_weight (3E, E), out_proj      [W_q; W_k; W_v] by rows
    mha-kdim   nn.MultiheadAttention(kdim, vdim): q/k/v_proj_weight        (out, in): transposed

Each converter takes ``(entries, prefix, source)`` and returns ``{textbook name: array}`` (and
``origin``). They are entries of the one registry of weight layouts, attncli.io.layouts.LAYOUTS,
which recognises them by a marker key and holds the checkpoint layouts beside them; the
nn.MultiheadAttention one serves weights files and checkpoints alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from attncli.core.arrays import numeric_array
from attncli.core.projections import BIASES, EXTRAS, PROJECTIONS
from attncli.errors import InputError

Entries = Mapping[str, Any]
Converter = Callable[[Entries, str, str], dict[str, Any]]  # (entries, prefix, source) -> {name: array}


def _get(entries: Entries, key: str, source: str, why: str) -> np.ndarray:
    if key not in entries:
        raise InputError(f"has {why} but no {key!r}: a state dict with this layout needs it "
                         f"(it has {', '.join(map(str, entries))})", source)
    return numeric_array(entries[key], key, source)


def _opt(entries: Entries, key: str, source: str) -> np.ndarray | None:
    return None if key not in entries else numeric_array(entries[key], key, source)


def _t(a: np.ndarray | None) -> np.ndarray | None:
    """An ``nn.Linear`` weight (out, in) in the textbook convention (in, out)."""
    return None if a is None else (a.T if a.ndim == 2 else a)


def textbook(e: Entries, p: str, source: str) -> dict[str, Any]:
    out: dict[str, Any] = {n: _get(e, p + n, source, "W_q") for n in ("W_q", "W_k", "W_v")}
    out.update({n: _opt(e, p + n, source) for n in ("W_o", *BIASES, *EXTRAS)})
    return out


def _linear_layers(e: Entries, p: str, source: str, names: tuple[str, str, str, str], kind: str) -> dict[str, Any]:
    q, k, v, o = names
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for t, layer in zip(PROJECTIONS, names):
        key = f"{p}{layer}.weight"
        w = _get(e, key, source, f"{p}{q}.weight ({kind})") if layer != o else _opt(e, key, source)
        out[t] = _t(w)
        origin[t] = f"{key}ᵀ"
        b = _opt(e, f"{p}{layer}.bias", source)
        out["b_" + t[-1]] = b
        if b is not None:
            origin["b_" + t[-1]] = f"{p}{layer}.bias"
    out["origin"] = origin
    return out


def d2l(e: Entries, p: str, source: str) -> dict[str, Any]:
    return _linear_layers(e, p, source, ("W_q", "W_k", "W_v", "W_o"), "nn.Linear layers W_q, W_k, W_v")


def notes(e: Entries, p: str, source: str) -> dict[str, Any]:
    return _linear_layers(e, p, source, ("q", "k", "v", "o"), "nn.Linear layers q, k, v")


def _mha_rest(e: Entries, p: str, source: str, out: dict[str, Any], origin: dict[str, str], widths: list[int]) -> dict[str, Any]:
    for extra in ("bias_k", "bias_v"):
        if p + extra in e:
            raise InputError(f"holds {p + extra}: nn.MultiheadAttention(add_bias_kv=True) is not supported", source)
    bias = _opt(e, p + "in_proj_bias", source)
    if bias is not None:
        if bias.shape != (sum(widths),):
            raise InputError(f"{p}in_proj_bias has shape {bias.shape}; expected ({sum(widths)},) "
                             "(the q, k, v biases one after the other)", source)
        start = 0
        for n, w in zip(("b_q", "b_k", "b_v"), widths):
            out[n], origin[n] = bias[start:start + w], f"{p}in_proj_bias[{start}:{start + w}]"
            start += w
    out["W_o"] = _t(_get(e, p + "out_proj.weight", source, "nn.MultiheadAttention weights"))
    origin["W_o"] = f"{p}out_proj.weightᵀ"
    out["b_o"] = _opt(e, p + "out_proj.bias", source)
    if out["b_o"] is not None:
        origin["b_o"] = f"{p}out_proj.bias"
    out["origin"] = origin
    return out


def mha_packed(e: Entries, p: str, source: str) -> dict[str, Any]:
    w = numeric_array(e[p + "in_proj_weight"], "in_proj_weight", source)
    if w.ndim != 2 or w.shape[0] % 3:
        raise InputError(f"{p}in_proj_weight has shape {w.shape}; expected (3·E, E) "
                         "(the q, k and v projections stacked)", source)
    d = w.shape[0] // 3
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for i, n in enumerate(("W_q", "W_k", "W_v")):
        out[n], origin[n] = w[i * d:(i + 1) * d].T, f"{p}in_proj_weight[{i * d}:{(i + 1) * d}]ᵀ"
    return _mha_rest(e, p, source, out, origin, [d, d, d])


def mha_separate(e: Entries, p: str, source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for n, key in (("W_q", "q_proj_weight"), ("W_k", "k_proj_weight"), ("W_v", "v_proj_weight")):
        out[n], origin[n] = _t(_get(e, p + key, source, "q_proj_weight (nn.MultiheadAttention with kdim/vdim)")), f"{p}{key}ᵀ"
    widths = [int(out[n].shape[1]) if out[n].ndim == 2 else 0 for n in ("W_q", "W_k", "W_v")]
    return _mha_rest(e, p, source, out, origin, widths)


def entries_of(content: Any, source: str) -> dict[str, Any]:
    """A weights file's entries: the mapping itself, or its ``weights:`` sub-mapping."""
    if not isinstance(content, dict):
        raise InputError("holds a single array; projection weights need named entries "
                         "(W_q, W_k, W_v, ... or a PyTorch state dict)", source)
    inner = content.get("weights")
    if isinstance(inner, dict):
        return inner
    return content
