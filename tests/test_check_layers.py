"""``attncli check OUTS HIDDEN --weights MODEL --layer all --from-residual``: every layer of a port at once.

The reference is transformers' own: a 4-layer tiny Llama (random config, ``save_pretrained``), each layer's attention
output captured from ``o_proj`` with forward hooks, the hidden states from ``output_hidden_states=True``. The planted
mistake recomputes layer 2's attention with transformers' own functions (input_layernorm, the projections,
``apply_rotary_pos_emb``, ``repeat_kv``, o_proj) but without the causal mask; the same recomputation with the mask
must give the hooked output back (so the planted numbers differ only by the mask).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
runner = CliRunner()
LAYERS, T, HEADS, KV, E = 4, 12, 4, 2, 64


def port(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hidden states (layers + 1, 1, T, E), each layer's attention output (layers, 1, T, E), layer 2's output
    recomputed without the causal mask)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=E, intermediate_size=128, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, num_key_value_heads=KV, initializer_range=0.1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    outs: dict[int, Any] = {}

    def capture(i: int) -> Any:
        def hook(m: Any, args: Any, y: Any) -> None:  # returns None: the module's output stays its own
            outs.setdefault(i, y.detach().clone())
        return hook

    for i, layer in enumerate(model.model.layers):
        layer.self_attn.o_proj.register_forward_hook(capture(i))
    ids = torch.randint(0, 100, (1, T))
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        layer = model.model.layers[2]
        attn, d = layer.self_attn, E // HEADS
        h = layer.input_layernorm(hs[2])
        q = attn.q_proj(h).view(1, T, HEADS, d).transpose(1, 2)  # (1, H, T, d)
        k = attn.k_proj(h).view(1, T, KV, d).transpose(1, 2)
        v = attn.v_proj(h).view(1, T, KV, d).transpose(1, 2)
        cos, sin = model.model.rotary_emb(h, torch.arange(T)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, HEADS // KV), repeat_kv(v, HEADS // KV)
        s = (q @ k.transpose(-1, -2)) * d ** -0.5  # (1, H, T, d) x (1, H, d, T) -> (1, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()

        def finish(scores: Any) -> Any:
            o = torch.softmax(scores, dim=-1) @ v  # (1, H, T, T) x (1, H, T, d) -> (1, H, T, d)
            return attn.o_proj(o.transpose(1, 2).reshape(1, T, E))

        same = finish(s.masked_fill(~causal, float("-inf")))
        planted = finish(s)
    np.testing.assert_allclose(same.numpy(), outs[2].numpy(), atol=1e-5)  # the recomputation is HF's layer
    stacked = np.stack([outs[i].numpy() for i in range(LAYERS)])
    return np.stack([x.numpy() for x in hs]), stacked, planted.numpy()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    folder = tmp_path_factory.mktemp("llama4")
    return (folder, *port(folder / "model"))


def run_all(folder: Path, outs: np.ndarray, hidden: np.ndarray, form: str, *extra: str) -> Any:
    if form == "npy":
        np.save(folder / "outs.npy", outs)
        np.save(folder / "hidden.npy", hidden)
        files = [folder / "outs.npy", folder / "hidden.npy"]
    else:
        np.savez(folder / "outs.npz", **{str(i): a for i, a in enumerate(outs)})
        np.savez(folder / "hidden.npz", **{str(i): a for i, a in enumerate(hidden)})
        files = [folder / "outs.npz", folder / "hidden.npz"]
    return runner.invoke(app, ["check", *map(str, files), "--weights", str(folder / "model"), "--layer", "all",
                               "--from-residual", *extra])


@pytest.mark.parametrize("form", ["npy", "npz"])
def test_every_layer_of_hugging_faces_own_model_matches(model: Any, form: str) -> None:
    folder, hidden, outs, _ = model
    r = run_all(folder, outs, hidden, form, "-f", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0, r.stdout[:500]
    assert doc["verdict"] == "match" and doc["first_diverging_layer"] is None
    assert [x["match"] for x in doc["layers"]] == [True] * LAYERS


@pytest.mark.parametrize("form", ["npy", "npz"])
def test_a_mistake_planted_in_layer_2_is_the_first_that_diverges_and_is_named(model: Any, form: str) -> None:
    folder, hidden, outs, planted = model
    bad = outs.copy()
    bad[2] = planted
    r = run_all(folder, bad, hidden, form, "-f", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1
    assert [x["match"] for x in doc["layers"]] == [True, True, False, True]
    assert doc["first_diverging_layer"] == 2 and doc["mismatched_layers"] == [2]
    assert [e["name"] for e in doc["layers"][2]["explanations"]] == ["causal-missing"]
    r = run_all(folder, bad, hidden, form)
    assert r.exit_code == 1
    assert r.stdout.startswith("MISMATCH: 1 of 4 layers differ; the first that diverges is layer 2")
    assert "Layer 2, the first that diverges:" in r.stdout and "causal-missing" in r.stdout


BAD = [
    (lambda o, h: (o[:3], h), "holds 3 layers' outputs, but the checkpoint has 4 layers"),
    (lambda o, h: (o, h[:2]), "holds 2 hidden states; expected 5"),
    (lambda o, h: (o[0, 0], h), "are stacked as (layers, batch, T, E)"),
]


@pytest.mark.parametrize("change,message", BAD)
def test_wrong_stacks_are_refused_in_one_line(model: Any, change: Any, message: str) -> None:
    folder, hidden, outs, _ = model
    o, h = change(outs, hidden)
    r = run_all(folder, o, h, "npy")
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


def test_layer_all_is_checks_alone(model: Any) -> None:
    folder = model[0]
    r = runner.invoke(app, ["self", str(folder / "hidden.npy"), "--weights", str(folder / "model"), "--layer", "all"])
    assert r.exit_code == 2 and "--layer" in r.stderr and "attncli check" in r.stderr
