"""The one resolver (attncli.io.layouts.layer_kind / layer_options): what config.json says of a layer, as the
family's row declares it, checked against transformers' own modules."""

from __future__ import annotations

import pytest

from attncli.errors import InputError
from attncli.io.families import FAMILIES
from attncli.io.layouts import RESOLVE_STEPS, AttentionFacts, ConfigFact, layer_kind

transformers = pytest.importorskip("transformers")


def test_nope_layers_as_smollm3_builds_them() -> None:
    """SmolLM3Attention.use_rope (transformers' module, from no_rope_layer_interval) is the resolver's not-NoPE."""
    cfg = transformers.SmolLM3Config(num_hidden_layers=6, no_rope_layer_interval=3, hidden_size=32,
                                     intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.SmolLM3Model(cfg)
    theirs = [bool(layer.self_attn.use_rope) for layer in model.layers]
    ours = [not layer_kind(FAMILIES["smollm3"], cfg.to_dict(), i, "config.json", "").nope for i in range(6)]
    assert ours == theirs and not all(theirs)  # layers 2 and 5 are NoPE


def test_layer_types_required_where_declared() -> None:
    """A family whose row requires layer_types (AFMoE) is refused without them, naming config.json's key."""
    with pytest.raises(InputError, match="layer_types"):
        layer_kind(FAMILIES["afmoe"], {"model_type": "afmoe"}, 0, "config.json", "")
    assert layer_kind(FAMILIES["afmoe"], {"layer_types": ["sliding_attention", "full_attention"]}, 1,
                      "config.json", "").type == "full_attention"


def test_steps_and_fact_names() -> None:
    """The window step comes after the chunk step (a chunked layer's window reads its chunk); every name
    ConfigFact allows is a field of AttentionFacts."""
    names = [s.__name__ for s in RESOLVE_STEPS]
    assert names.index("_opt_chunk") < names.index("_opt_window")
    from typing import get_args
    assert set(get_args(ConfigFact)) <= set(AttentionFacts.__dataclass_fields__)
