"""The library's calls for a checkpoint layer: what ``attncli self X --weights MODEL --layer N`` computes, as Python.

    import attncli
    layer = attncli.load_layer("./tiny-llama", layer=3)   # a folder, .safetensors, a sharded index, .pt/.bin
    trace = layer.attend(x)                                # x (T, E) or (B, T, E): the input of the query projection
    trace = layer.attend(h, from_residual=True)            # h = hidden_states[3]: the layer's own norm first
    trace = layer.attend(x, window=4, rope_base=1e4)       # options (attncli.Options fields) over config.json's
    trace["weights"], trace["output"], trace.names()

A thin public wrapper over attncli.io.model (the reader) and attncli.core.engine (the one pipeline): the same
problem and the same Trace (numbers, steps, labels) as the command. Bad input raises an exception of
attncli.errors (InputError); nothing exits, nothing process-wide is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attncli.core.layer import Layer
    from attncli.core.options import Options
    from attncli.core.trace import Trace
    from attncli.io.model import CheckpointLayer

__all__ = ["ModelLayer", "load_layer"]


class ModelLayer:
    """One attention layer of a checkpoint: ``attend(x)`` computes it (see :func:`load_layer`)."""

    def __init__(self, checkpoint: CheckpointLayer, heads: int | None = None) -> None:
        self.checkpoint = checkpoint  # the reader's view: projections, config facts, norms, bias (attncli.io.model)
        self._heads = heads  # as given to load_layer (where no config.json says it)

    def __repr__(self) -> str:
        c = self.checkpoint
        return f"<attncli layer {c.layer} of {c.source} ({c.layout}, {c.heads} heads)>"

    @property
    def layer(self) -> int:
        return self.checkpoint.layer

    @property
    def heads(self) -> int | None:
        return self._heads or self.checkpoint.heads

    @property
    def source(self) -> str:
        return self.checkpoint.source

    @property
    def options(self) -> Options:
        """config.json's facts as :class:`attncli.Options` (what ``attend`` computes with unless told otherwise)."""
        return self.checkpoint.config_options()

    def problem(self, x: Any, memory: Any = None, values: Any = None, *, from_residual: bool = False,
                mask: Any = None, valid_lens: Any = None, key_padding_mask: Any = None,
                labels: Any = None, query_labels: Any = None, key_labels: Any = None, sinks: Any = None,
                alibi_slopes: Any = None, batch_first: bool = True, **options: Any) -> Layer:
        """The validated problem of this layer on ``x`` (see :meth:`attend`), before it is computed."""
        opts = self.checkpoint.config_options().merged(options, "attend()")
        sources = {n: f"attend({n}=...)" for n in ("q", "k", "v", "mask", "key_padding_mask", "valid_lens", "sinks",
                                                  "alibi_slopes", "query_labels", "key_labels")}
        sources |= {"q": "attend(x=...)", "k": "attend(memory=...)", "v": "attend(values=...)"}
        config = self.checkpoint.config_source
        sources |= {f"option {n}": self.checkpoint.option_origin(n) for n in self.checkpoint.options} | {"pre_norm": config}
        sources |= {f"option {n}": f"attend({n}=...)" for n, v in options.items() if v is not None}
        sources["weights"] = self.checkpoint.projections.source
        if labels is not None:
            query_labels = labels if query_labels is None else query_labels
            key_labels = labels if key_labels is None and memory is None else key_labels
        return self.checkpoint.problem(x, memory, values, options=opts, heads=self._heads, from_residual=from_residual,
                                       batch_first=batch_first, valid_lens=valid_lens, mask=mask, padding=key_padding_mask,
                                       query_labels=query_labels, key_labels=key_labels, sources=sources, sinks=sinks,
                                       alibi_slopes=alibi_slopes)

    def attend(self, x: Any, memory: Any = None, values: Any = None, *, from_residual: bool = False,
               mask: Any = None, valid_lens: Any = None, key_padding_mask: Any = None,
               labels: Any = None, query_labels: Any = None, key_labels: Any = None, sinks: Any = None,
               alibi_slopes: Any = None, batch_first: bool = True, **options: Any) -> Trace:
        """This layer's attention on ``x`` (T, E) or (B, T, E), every step: the same :class:`attncli.Trace` as
        ``attncli self X --weights MODEL --layer N --format json``.

        ``x`` is the input of the query projection; ``from_residual=True`` takes the residual stream entering the
        layer (``hidden_states[N]``) and applies the layer's own norm first. ``memory``/``values``: cross-attention.
        ``options``: fields of :class:`attncli.Options` (``window=``, ``causal=``, ``keep_weights=False`` ...), over
        config.json's. ``labels`` names the tokens (queries, and keys in self-attention)."""
        from attncli.core.engine import run
        from attncli.io.capture import Capture

        if isinstance(x, Capture):  # the residual stream entering this layer, its tokens, padding; verified
            return attend_capture(self, x, keep_going=bool(options.pop("keep_going", False)), **options)
        return run(self.problem(x, memory, values, from_residual=from_residual, mask=mask,
                                valid_lens=valid_lens, key_padding_mask=key_padding_mask, labels=labels,
                                query_labels=query_labels, key_labels=key_labels, sinks=sinks,
                                alibi_slopes=alibi_slopes, batch_first=batch_first, **options))


def attend_capture(layer: ModelLayer, capture: Any, *, keep_going: bool = False, **options: Any) -> Trace:
    """``layer.attend(capture)``: the layer on the residual stream a capture (attncli.io.hf.capture, or
    attncli.io.capture.read_capture) holds for it, its pre-norm first; tokens as labels, padding as the key padding
    mask, padded queries left out. Where the capture holds the model's own attention for the layer, the weights
    are compared with it (``trace.extra["model_attention"]``) and a difference beyond check's bound for the
    capture's dtype raises InputError (``keep_going=True``: kept in the trace, agrees false)."""
    import numpy as np

    from attncli.check.model import model_attention
    from attncli.core.engine import run
    from attncli.errors import InputError

    decoder = "decoder" in layer.checkpoint.projections.origin.get("W_q", "") and capture.decoder is not None
    stack = capture.decoder if decoder else capture.stack
    x = stack.state(layer.layer, capture.source)
    pad = stack.padding
    rows = [list(r) for r in stack.labels]
    same = all(r == rows[0] for r in rows)
    labels = rows[0] if same else [" | ".join(dict.fromkeys(c)) for c in zip(*rows)]
    keep = ~pad[:, None, :, None] if pad.any() else None
    problem = layer.problem(x, from_residual=True, key_padding_mask=pad if pad.any() else None,
                            mask=None if keep is None else (keep if options.get("mask_convention", "keep") == "keep"
                                                            else ~keep), labels=labels, **options)
    trace = run(problem)
    trace.extra["labels"] = {"queries": rows[0] if same else rows, "keys": rows[0] if same else rows}  # per entry
    own = stack.model_attention(layer.layer)
    if own is not None and "weights" in trace:
        valid = ~np.asarray(pad)
        a = model_attention(problem, trace, own, (valid, valid), layer=layer.layer, dtype=capture.dtype,
                            family=capture.family, source=capture.source)
        trace.extra["model_attention"] = a.to_dict()
        if not a.agrees and not keep_going:
            raise InputError(f"layer {a.layer}: the recomputation differs from the model's own attention by "
                             f"{a.max_abs_diff:.1e} (bound {a.bound:.1e}, family {a.family}); keep_going=True keeps it",
                             capture.source)
    return trace


def load_layer(model: str | Path, layer: int | None = None, *, prefix: str | None = None, heads: int | None = None,
               layout: str | None = None) -> ModelLayer:
    """Layer ``layer`` of the checkpoint ``model`` (a save_pretrained folder, a .safetensors file, a sharded index,
    a .pt/.pth/.bin state dict): only that layer's tensors are read. ``prefix`` picks a stack (T5's encoder or
    decoder); ``heads`` where no config.json says it; ``layout`` a declared family for a model_type attncli does not
    declare. Raises :class:`attncli.errors.InputError` (one line naming the file, key or tensor) on what it cannot
    read."""
    from attncli.io.model import load_layer as read

    return ModelLayer(read(model, layer, prefix, heads=heads, layout=layout), heads)
