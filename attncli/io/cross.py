"""A decoder layer's cross-attention over the encoder's output (io layer): BART's ``encoder_attn`` and T5's
``EncDecAttention``, read beside the layer's self-attention (attncli.io.model.load_layer), which settles the family,
heads and block.

    layer = load_cross_layer("./tiny-bart", 1, "model.decoder.layers.")
    layer.problem(x, memory)   # x: the input of encoder_attn's q_proj; memory: the encoder's last hidden state

One row per layout: where the module lives in the block, its four projections, and its scaling; nothing else of
the self-attention carries over (no causal mask, no rotary, no relative position bias: transformers' cross-attention
has none of them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attncli.core.projections import Projections
from attncli.errors import InputError
from attncli.io.checkpoint import open_checkpoint
from attncli.io.model import CheckpointLayer, load_layer, numbers


@dataclass(frozen=True)
class CrossReader:
    """Where a layout keeps its cross-attention: ``self_attn`` (the self-attention's module in the block, to find
    the block), ``module`` (the cross-attention's), its q, k, v, o names, and its score scaling (None: 1/sqrt(d))."""

    self_attn: str
    module: str
    names: tuple[str, str, str, str]
    scale: float | None


CROSS_READERS = {
    "bart": CrossReader("self_attn.", "encoder_attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), None),
    "t5": CrossReader("layer.0.SelfAttention.", "layer.1.EncDecAttention.", ("q", "k", "v", "o"), 1.0),
}


def decoder_prefix(ckpt: Any) -> str | None:
    """The prefix of the blocks that hold a cross-attention module (``model.decoder.layers.`` of BART,
    ``decoder.block.`` of T5), read off the tensor names; None when no name or more than one stack has one."""
    found = set()
    for name in ckpt.tensors:
        for reader in CROSS_READERS.values():
            at = name.find("." + reader.module)
            if at > 0:
                head, _, number = name[:at].rpartition(".")
                if number.isdigit():
                    found.add(head + ".")
    return found.pop() if len(found) == 1 else None


def load_cross_layer(path: str, layer: int | None, prefix: str | None = None, *, heads: int | None = None) -> CheckpointLayer:
    """The cross-attention of decoder layer ``layer`` as a CheckpointLayer (projections, heads, options).
    Without ``prefix``, the stack whose blocks hold a cross-attention module (the decoder's) is read."""
    if prefix is None:
        prefix = decoder_prefix(open_checkpoint(path))
    own = load_layer(path, layer, prefix, heads=heads)
    reader = CROSS_READERS.get(own.layout)
    if reader is None:
        raise InputError(f"--cross reads the cross-attention of the {', '.join(CROSS_READERS)} layouts; "
                         f"this checkpoint's is {own.layout}", path)
    q_origin = own.projections.origin.get("W_q", "")
    at = q_origin.find(reader.self_attn)
    if at < 0:
        raise InputError(f"layer {own.layer} is no decoder layer with a cross-attention ({q_origin})", path)
    module = q_origin[:at] + reader.module
    ckpt = open_checkpoint(path)
    arrays, origin = {}, {}
    for slot, name in zip("qkvo", reader.names):
        w = f"{module}{name}.weight"
        if w not in ckpt:
            raise InputError(f"has no {w}: layer {own.layer} has no cross-attention (a decoder layer of an "
                             "encoder-decoder model has one)", path)
        arrays[f"W_{slot}"], origin[f"W_{slot}"] = numbers(ckpt.tensor(w)).T, f"{w}ᵀ"
        b = f"{module}{name}.bias"
        if b in ckpt:
            arrays[f"b_{slot}"], origin[f"b_{slot}"] = numbers(ckpt.tensor(b)), b
    proj = Projections(**arrays, source=f"{own.source} layer {own.layer} cross-attention",  # type: ignore[arg-type]
                       origin=origin, kind=own.layout, config=own.projections.config)
    options: dict[str, Any] = {"kv_heads": own.heads} if own.heads else {}
    if reader.scale is not None:
        options["scale"] = reader.scale
    return replace(own, projections=proj, options=options, norm=None, sub_norm=None, gate=None, relative_bias=None,
                   facts=replace(own.facts, pre_norm=None, notes={"cross_attention": module.rstrip(".")}))
