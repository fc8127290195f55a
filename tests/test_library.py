"""The library's checkpoint call (issue 30, item 8): ``attncli.load_layer(MODEL, layer=N).attend(x)`` returns the same
Trace as ``attncli self X --weights MODEL --layer N --format json`` (run as a subprocess: numbers, steps, labels), and
both equal transformers' own attention module (its input, output_attentions, and its output projection's output), for
a tiny random model of each layout kind: Llama (separate nn.Linear), GPT-2 (Conv1D, fused by columns), BERT (post-norm),
T5 (relative position bias), Falcon (fused (G, H/G + 2, d)), Phi-3 (fused [Q; K; V] by rows), DeepSeek-V2 and -V3 (MLA),
GPT-NeoX (fused (H, 3, d), partial rotary), BART (encoder-decoder, post-norm) and ModernBERT (fused Wqkv, local window);
with and without from_residual (--from-residual).
Errors are exceptions of attncli.errors, never exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attncli  # noqa: E402
from attncli.errors import AttnError, InputError  # noqa: E402
from attncli.render import RenderOptions  # noqa: E402
from attncli.render.data import trace_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5  # float32 computation against the float32 model, as the families sweep


def _cli_json(x_path: Path, folder: Path, layer: int, *extra: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "attncli", "self", str(x_path), "--weights", str(folder), "--layer",
                          str(layer), "--format", "json", *extra], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _same_as_cli(trace: Any, cli: dict[str, Any]) -> None:
    """The library's trace written as JSON equals the command's JSON: every field (the command also attaches the
    view's diagnostics, which are not part of the trace)."""
    mine = json.loads(json.dumps(trace_dict(trace, RenderOptions())))
    cli = {k: v for k, v in cli.items() if k != "diagnostics"}
    assert mine.keys() == cli.keys()
    assert [s["name"] for s in mine["steps"]] == [s["name"] for s in cli["steps"]]
    for k in mine:
        assert mine[k] == cli[k], k


def _agrees(trace: Any, weights: np.ndarray, y: np.ndarray) -> None:
    w, out = np.asarray(trace["weights"], np.float64), np.asarray(trace["output"], np.float64)
    assert w.shape == weights.shape and out.shape == y.shape
    assert float(np.abs(w - weights).max()) < TOL
    assert float(np.abs(out - y).max()) / max(1.0, float(np.abs(y).max())) < TOL


LAYOUTS = ["llama", "gpt2", "bert", "falcon", "phi3", "deepseek_v2", "deepseek_v3", "gpt_neox", "bart", "modernbert"]


@pytest.mark.parametrize("model_type", LAYOUTS)
def test_load_layer_attend_is_attncli_self_and_the_model(model_type: str, tmp_path: Path) -> None:
    from test_families import build

    built = build(model_type, tmp_path / "model")
    layer = max(built.layers)
    got = built.layers[layer]
    x_path = tmp_path / "x.npy"
    np.save(x_path, got["x"].astype(np.float32))
    x = np.load(x_path)
    lay = attncli.load_layer(tmp_path / "model", layer=layer)
    assert isinstance(lay, attncli.ModelLayer) and lay.layer == layer and isinstance(lay.options, attncli.Options)
    trace = lay.attend(x)
    assert isinstance(trace, attncli.Trace)
    _same_as_cli(trace, _cli_json(x_path, tmp_path / "model", layer))
    _agrees(trace, got["weights"], got["y"])
    if "hidden" in got:  # from_residual=True is --from-residual: the residual entering the layer, its own norm first
        h_path = tmp_path / "h.npy"
        np.save(h_path, got["hidden"].astype(np.float32))
        trace = lay.attend(np.load(h_path), from_residual=True)
        _same_as_cli(trace, _cli_json(h_path, tmp_path / "model", layer, "--from-residual"))
        _agrees(trace, got["weights"], got["y"])


def test_from_residual_and_options_and_labels_as_the_command(tmp_path: Path) -> None:
    """from_residual=True is --from-residual (the layer's own RMSNorm of hidden_states[N] first); an option given to
    attend() is the flag (window=3 is --window 3); labels are --labels."""
    from test_families import build

    built = build("llama", tmp_path / "model")
    layer = max(built.layers)
    got = built.layers[layer]
    h_path = tmp_path / "h.npy"
    np.save(h_path, got["hidden"].astype(np.float32))
    h = np.load(h_path)
    lay = attncli.load_layer(tmp_path / "model", layer=layer)
    trace = lay.attend(h, from_residual=True)
    assert "x_norm" in trace.names()
    _same_as_cli(trace, _cli_json(h_path, tmp_path / "model", layer, "--from-residual"))
    _agrees(trace, got["weights"], got["y"])
    labels = [f"t{i}" for i in range(h.shape[0])]
    windowed = lay.attend(h, from_residual=True, window=3, labels=labels)
    _same_as_cli(windowed, _cli_json(h_path, tmp_path / "model", layer, "--from-residual", "--window", "3",
                                     "--labels", ",".join(labels)))
    assert windowed.query_labels == labels and windowed.key_labels == labels
    w = windowed["weights"]
    assert np.all(w[:, 5, :3] == 0) and np.all(w[:, 5, 3:6] > 0)  # query 5 sees keys 3, 4, 5 only


def test_t5_stack_by_prefix(tmp_path: Path) -> None:
    """T5 (relative position bias from layer 0, encoder and decoder): prefix= is --prefix."""
    from test_layouts import T, hooks, tiny_t5

    model = tiny_t5(tmp_path / "model")
    for stack in ("encoder", "decoder"):
        attn = getattr(model, stack).block[1].layer[0].SelfAttention
        got: dict[str, Any] = {}
        h1, h2 = hooks(attn, attn.o, got)
        ids = (torch.arange(T)[None] * 7) % 50
        with torch.no_grad():
            res = model(input_ids=ids, decoder_input_ids=ids, output_attentions=True)
        h1.remove()
        h2.remove()
        weights = (res.encoder_attentions if stack == "encoder" else res.decoder_attentions)[1][0].double().numpy()
        x_path = tmp_path / f"x_{stack}.npy"
        np.save(x_path, got["x"][0].numpy().astype(np.float32))
        trace = attncli.load_layer(tmp_path / "model", layer=1, prefix=stack).attend(np.load(x_path))
        _same_as_cli(trace, _cli_json(x_path, tmp_path / "model", 1, "--prefix", stack))
        _agrees(trace, weights, got["y"][0].double().numpy())


def test_errors_are_exceptions_never_exits(tmp_path: Path) -> None:
    """A missing model, a layer that does not exist, an unknown option, an input of the wrong width: InputError
    (an attncli.errors exception, one line naming the culprit), never SystemExit."""
    from test_layouts import build

    with pytest.raises(InputError) as e:
        attncli.load_layer(tmp_path / "nowhere", layer=0)
    assert "nowhere" in str(e.value) and "\n" not in str(e.value)
    _, got = build("llama", tmp_path / "model")
    with pytest.raises(InputError, match="layer"):
        attncli.load_layer(tmp_path / "model", layer=99)
    lay = attncli.load_layer(tmp_path / "model", layer=got["layer"])
    with pytest.raises(InputError, match="windw.*window"):
        lay.attend(got["x"], windw=3)
    with pytest.raises(AttnError):
        lay.attend(np.zeros((4, 7)))
    assert attncli.errors.InputError is InputError


def test_attend_and_options_are_public() -> None:
    """attncli.attend as before; attncli.Options is the options' type (every field a keyword of attend)."""
    # Bahdanau-free textbook case: two orthogonal unit keys, query equal to the first: weights e/(e+1), 1/(e+1)
    trace = attncli.attend(np.array([[1.0, 0.0]]), np.eye(2), np.eye(2), score="dot")
    e = np.e
    np.testing.assert_allclose(trace.weights, [[e / (e + 1), 1 / (e + 1)]], rtol=1e-12)
    assert "causal" in {f for f in attncli.Options.__dataclass_fields__}
    assert set(attncli.__all__) >= {"attend", "load_layer", "Options", "Trace", "errors"}
