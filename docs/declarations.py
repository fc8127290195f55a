"""Print the declarations table of docs/families.md from the registry itself (attncli.io.families).

    python docs/declarations.py > /tmp/declarations.md

Families whose declarations read alike share a row; each column is a field of :class:`attncli.io.families.Family`
(the rule functions by name), the last one every config key the declaration reads besides the shape keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attncli.io.families import FAMILIES, REFUSED, SHAPE_KEYS, Family


def _rule(f: Callable[..., Any] | None) -> str:
    return "—" if f is None else f.__name__.lstrip("_").replace("_", " ")


def _row(fam: Family) -> tuple[str, ...]:
    norm = "none (post-norm)" if fam.pre_norm is None else f"{fam.pre_norm} `{fam.norm_name}`, {fam.norm_at} the module"
    qk = "—" if fam.qk_norm is None else f"{fam.qk_norm}{' weightless' if fam.qk_weightless else ''}, {fam.qk_at}" + (
        f", switch `{fam.qk_key}`" if fam.qk_key else "") + (f", layers: {_rule(fam.qk_layers)}" if fam.qk_layers else "")
    extra = [x for x in (f"chunked: {_rule(fam.chunked)}" if fam.chunked else "",
                         f"sub-norm `{fam.sub_norm}`" if fam.sub_norm else "",
                         f"output gate {fam.gate[1]}(`{fam.gate[0]}`)" if fam.gate else "",
                         f"heads per layer `{fam.heads_key}`" if fam.heads_key else "",
                         f"rotary base per layer `{fam.theta_key}`" if fam.theta_key else "",
                         "NTK alpha" if fam.rope_alpha else "",
                         "RMSNorm w in float32" if fam.rms_wide else "",
                         f"RoPE rounded {fam.rope_rounding}" if fam.rope_rounding else "",
                         f"fused q/k/v: {fam.fused}" if fam.fused else "",
                         "stored sinusoidal rotary table checked" if fam.rope_table else "",
                         "rotary over the whole head, no scaling" if fam.rope_whole else "",
                         f"partial rotary {fam.partial_default} by default" if fam.partial_default else "",
                         "rope_type " + ", ".join(f"{a} read as {b}" for a, b in fam.rope_renamed)
                         if fam.rope_renamed else "",
                         "rope_type only " + " or ".join(sorted(fam.rope_types)) if fam.rope_types else "",
                         f"rotary style `{fam.rope_switch}`" if fam.rope_switch else "",
                         f"rotary width `{fam.rotary_key}`" if fam.rotary_key else "",
                         f"layer types: {_rule(fam.layer_type)}" if fam.layer_type else "",
                         f"window `{fam.window_key}`" + (f" (default {fam.window_default})" if fam.window_default
                                                         else "") if fam.window_key != "sliding_window" else "",
                         f"window `{fam.window_half[0]}` // 2 (default {fam.window_half[1]}) without "
                         f"`{fam.window_key}`" if fam.window_half else "",
                         "layer types read: " + ", ".join(fam.layer_kinds) if fam.layer_kinds else "",
                         "rotary base per layer type: " + ", ".join(f"`{k}` ({d:g})" for _, k, d, _ in fam.type_theta)
                         if fam.type_theta else "",
                         f"no norm on: {_rule(fam.norm_skip)}" if fam.norm_skip else "",
                         "q/k/v projections, not the fused tensor" if fam.split_qkv else "",
                         f"relative position bias {fam.relative}" if fam.relative else "",
                         f"ALiBi {fam.alibi}" if fam.alibi else "",
                         f"post-norm when `{fam.norm_switch}` is false" if fam.norm_switch else "",
                         f"no norm weights when `{fam.norm_affine}` is false" if fam.norm_affine else "",
                         "requires " + ", ".join(f"`{k}`" for k, _ in fam.requires) if fam.requires else "") if x]
    keys = ", ".join(f"`{k}`" for k in sorted(fam.reads() - SHAPE_KEYS)) or "—"
    slides = "every layer" if fam.always_slides else _rule(fam.slides) if fam.slides else "—"
    scale = SCALES.get(fam.scale or "", fam.scale or "1/√d")
    causal = CAUSAL.get(fam.causal_from or "", "yes" if fam.causal else "no")
    return (fam.layout, fam.rope or "none", _rule(fam.nope), norm, qk, scale, causal, slides, "; ".join(extra) or "—",
            keys)


SCALES = {"none": "1", "gpt2": "`scale_attn_weights`, `scale_attn_by_inverse_layer_idx`", "mscale": "1/√d · mscale²"}
CAUSAL = {"is_decoder": "`is_decoder`", "decoder-stack": "the decoder's stack", "encoder-stack": "but the encoder's stack"}


def main() -> None:
    rows: dict[tuple[str, ...], list[str]] = {}
    for mt, fam in FAMILIES.items():
        rows.setdefault(_row(fam), []).append(mt)
    print("| families (model_type) | layout | rope | NoPE rule | norm (tensor, where it sits) | QK-norm (when its "
          "tensors are there) | scale | causal | sliding layers without layer_types | other | config keys read (besides "
          "the shape keys) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row, types in rows.items():
        print(f"| {', '.join(types)} | " + " | ".join(row) + " |")
    print()
    print("Shape keys, read by every declaration and checked against the tensors: "
          + ", ".join(f"`{k}`" for k in sorted(SHAPE_KEYS)) + ".")
    print()
    print(f"Known and refused by model_type ({len(REFUSED)}, one line each):")
    print()
    for mt, why in REFUSED.items():
        print(f"- `{mt}`: {why}")


if __name__ == "__main__":
    main()
