"""Every attention layer of a model port at once: one verdict per layer, the first that diverges, the mistake there.

    result = check_layers(outs, hidden, "./my-llama", from_residual=True)
    result.first        # the first layer whose output differs (None: every layer matches)
    result.verdicts[2]  # layer 2's Verdict; the catalogue was searched on the first diverging layer only

``hidden`` holds the residual stream entering each layer (``hidden_states`` of ``output_hidden_states=True``:
layers + 1 arrays, the last one unused) and ``outs`` each layer's attention output as the user computed it
(o_proj's output). Each layer is read with :func:`attncli.io.model.load_layer` and judged like
``attncli check --layer N`` (:func:`attncli.check.verdict.default_judgement`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attncli.check.verdict import Verdict, check, default_judgement
from attncli.core.backend import half_type
from attncli.core.engine import run
from attncli.errors import InputError, printable
from attncli.io.model import load_layer


@dataclass
class LayerVerdicts:
    """One verdict per layer (in order), and the first layer that differs. ``what`` is what was compared: each
    layer's attention "output" (OUTS HIDDEN) or its "weights" against the model's own (a capture's attentions);
    ``numbers`` each verdict's layer (a capture may hold the model's own attention for some layers only)."""

    verdicts: list[Verdict]
    source: str  # the checkpoint
    what: str = "output"
    numbers: list[int] | None = None

    @property
    def layers(self) -> list[int]:
        return list(range(len(self.verdicts))) if self.numbers is None else list(self.numbers)

    @property
    def match(self) -> bool:
        return all(v.match for v in self.verdicts)

    @property
    def first(self) -> int | None:
        """The first layer that differs (its number), or None."""
        return next((n for n, v in zip(self.layers, self.verdicts) if not v.match), None)

    @property
    def mismatched(self) -> list[int]:
        return [n for n, v in zip(self.layers, self.verdicts) if not v.match]

    def verdict_of(self, layer: int) -> Verdict:
        return self.verdicts[self.layers.index(layer)]

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {"verdict": "match" if self.match else "mismatch", "match": self.match, "what": self.what,
                "checkpoint": self.source, "first_diverging_layer": first, "mismatched_layers": self.mismatched,
                "layers": [{"layer": n, **v.to_dict()} for n, v in zip(self.layers, self.verdicts)], "errors": []}


def per_layer(content: Any, source: str, what: str) -> list[Any]:
    """An array stacked by layer (layers, [batch,] T, E), or a mapping with members '0', '1', ... (an .npz)."""
    if isinstance(content, dict):
        keys = [str(k) for k in content]
        if not keys or set(keys) != {str(i) for i in range(len(keys))}:
            shown = ", ".join(printable(k, 20) for k in keys[:6])
            raise InputError(f"holds {shown or 'no arrays'}; the {what} of every layer are members named 0, 1, 2, ... "
                             "(np.savez(f, **{str(i): a for i, a in enumerate(arrays)}))", source)
        by_name = {str(k): v for k, v in content.items()}
        return [by_name[str(i)] for i in range(len(keys))]
    a = np.asarray(content) if not hasattr(content, "shape") else content
    if a.ndim not in (3, 4):
        raise InputError(f"has shape {tuple(a.shape)}; the {what} of every layer are stacked as (layers, batch, T, E) "
                         "or (layers, T, E)", source)
    return [a[i] for i in range(a.shape[0])]


def check_layers(outs: Sequence[Any], hidden: Sequence[Any], path: str | Path, *, flags: dict[str, Any] | None = None,
                 prefix: str | None = None, heads: int | None = None, from_residual: bool = True,
                 batch_first: bool = True, given: dict[str, float] | None = None, precision: str | None = None,
                 search: bool = True, pairs: bool = True, sources: tuple[str, str] = ("OUTS", "HIDDEN")) -> LayerVerdicts:
    """Check ``outs[i]`` against layer ``i`` of the checkpoint at ``path`` computed on ``hidden[i]``, for every
    layer; the catalogue (``search``) runs on the first layer that differs only. ``flags``: Options fields over
    config.json's (as given on the command line)."""
    first = load_layer(path, 0, prefix, heads=heads)
    n = first.layers
    if len(outs) != n:
        raise InputError(f"holds {len(outs)} layers' outputs, but the checkpoint has {n} layers", sources[0])
    if len(hidden) not in (n, n + 1):
        raise InputError(f"holds {len(hidden)} hidden states; expected {n + 1} (output_hidden_states=True: the "
                         f"embeddings and each layer's output) or {n}", sources[1])
    verdicts: list[Verdict] = []
    found = False
    for i in range(n):
        layer = first if i == 0 else load_layer(path, i, prefix, heads=heads)
        base = layer.config_options()  # config.json's facts, the flags over them
        if flags:
            base = base.merged(flags, "command line", flags=True)
        problem = layer.problem(np.asarray(hidden[i]), options=base, heads=heads, from_residual=from_residual,
                                batch_first=batch_first)
        trace = run(problem)
        raw = outs[i]
        expected = np.asarray(raw, dtype=np.float32 if np.asarray(raw).dtype == np.float32 else np.float64)
        where = f"{sources[0]} layer {i}"
        tol, prec, prec_source = default_judgement(expected, None, half_type(raw), str(trace.meta.dtype),
                                                   where, given, precision)
        v = check(problem, expected, what="output", tolerance=tol, trace=trace, source=where, explain=False,
                  precision=prec, precision_source=prec_source, pairs=pairs)
        if not v.match and not found:
            found = True
            if search:  # the mistake of the first layer that differs: later ones inherit nothing from it
                v = check(problem, expected, what="output", tolerance=tol, trace=trace, source=where, explain=True,
                          precision=prec, precision_source=prec_source, pairs=pairs)
        verdicts.append(v)
    return LayerVerdicts(verdicts, str(path))
