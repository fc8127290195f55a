"""One meaning of X (issue 30, item 4): the families whose norm sits inside the attention module
(RoBERTa-PreLayerNorm, XLM-RoBERTa-XL, Megatron-BERT, ESM) read X as every other family does.

Without ``--from-residual``, X is the input of the query projection (``attention.self.query``'s input, after
the module's own LayerNorm); with it, X is the residual stream entering the layer (the attention module's
input, ``hidden_states[N]``) and attncli applies that LayerNorm first. Both are checked against the model's
own module (transformers, eager attention, hooks): its per-head weights (``output_attentions``) and its output
projection's output, within 1e-5 (float32 model, float32 inputs). Before the fix, plain mode normed X twice
(weights off by 0.17-0.35, exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402
from attncli.io.model import load_layer  # noqa: E402

TOL = 1e-5
T, LAYER = 7, 1
TINY = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=40,
            max_position_embeddings=64, type_vocab_size=2, pad_token_id=0, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
# model type -> (its config overrides, the name of the LayerNorm inside its attention module)
FAMILIES: dict[str, tuple[dict[str, Any], str]] = {
    "roberta-prelayernorm": ({}, "LayerNorm"),
    "xlm-roberta-xl": ({}, "self_attn_layer_norm"),
    "megatron-bert": ({}, "ln"),
    "esm": ({"mask_token_id": 1, "position_embedding_type": "absolute"}, "LayerNorm"),
    "esm-rotary": ({"mask_token_id": 1, "position_embedding_type": "rotary"}, "LayerNorm"),
}

runner = CliRunner()


def _model(name: str, folder: Path) -> dict[str, np.ndarray]:
    """The tiny model saved to ``folder`` (random weights large enough that a dropped or doubled norm shows:
    LayerNorm weights 1 + 0.5·U(-1, 1), biases N(0, 0.25)), run once: the residual entering layer LAYER's
    attention (h), its query projection's input (x), its per-head weights and its output projection's output."""
    over, _ = FAMILIES[name]
    mt = name.removesuffix("-rotary")
    cfg = transformers.AutoConfig.for_model(mt, **TINY, **over)
    torch.manual_seed(0)
    model = transformers.AutoModelForMaskedLM.from_config(cfg, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.ndim == 1:
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)
    model.save_pretrained(folder)
    layers = [m for n, m in model.named_modules() if n.endswith(f"layer.{LAYER}")]
    attn = layers[0].attention
    got: dict[str, Any] = {}

    def keep(key: str, value: Any) -> None:  # a hook that returns None changes nothing
        got.setdefault(key, value.detach())

    hooks = [attn.register_forward_pre_hook(lambda m, a, kw: keep("h", a[0] if a else kw["hidden_states"]),
                                            with_kwargs=True),
             attn.self.query.register_forward_pre_hook(lambda m, a: keep("x", a[0])),
             attn.output.dense.register_forward_hook(lambda m, a, r: keep("y", r))]
    ids = (torch.arange(T) * 5 + 3).remainder(35)[None] + 3
    try:
        with torch.no_grad():
            res = model(input_ids=ids, output_attentions=True)
    finally:
        for hk in hooks:
            hk.remove()
    got["weights"] = res.attentions[LAYER]
    return {k: v[0].double().numpy() for k, v in got.items()}


def _self(folder: Path, x: np.ndarray, work: Path, *extra: str) -> tuple[np.ndarray, np.ndarray]:
    np.save(work / "x.npy", x.astype(np.float32))
    res = runner.invoke(app, ["self", str(work / "x.npy"), "--weights", str(folder), "--layer", str(LAYER),
                              "--format", "json", *extra])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    return np.array(doc["weights"], np.float64), np.array(doc["output"], np.float64)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_x_is_the_query_projections_input(name: str, tmp_path: Path) -> None:
    """Plain mode: X = the query projection's input agrees; --from-residual: X = the residual agrees; and the
    two inputs differ (the module's LayerNorm is not the identity here), so each reading is really tested."""
    got = _model(name, tmp_path / "model")
    assert np.abs(got["x"] - got["h"]).max() > 0.1
    for x, extra in ((got["x"], ()), (got["h"], ("--from-residual",))):
        w, y = _self(tmp_path / "model", x, tmp_path, *extra)
        assert w.shape == got["weights"].shape and y.shape == got["y"].shape
        assert float(np.abs(w - got["weights"]).max()) < TOL, (name, extra)
        assert float(np.abs(y - got["y"]).max()) / max(1.0, float(np.abs(got["y"]).max())) < TOL, (name, extra)


@pytest.mark.parametrize("name", ["roberta-prelayernorm", "megatron-bert"])
def test_the_library_reads_x_the_same_way(name: str, tmp_path: Path) -> None:
    """load_layer: the norm is a fact of where it sits (norm_at 'inside'), applied only with from_residual."""
    from attncli.core.engine import run

    got = _model(name, tmp_path / "model")
    layer = load_layer(tmp_path / "model", LAYER)
    assert layer.facts.norm_at == "inside" and layer.norm is not None
    for x, residual in ((got["x"], False), (got["h"], True)):
        trace = run(layer.problem(x, from_residual=residual))
        assert float(np.abs(np.asarray(trace["weights"], np.float64) - got["weights"]).max()) < TOL


def test_a_missing_inside_norm_refuses_only_from_residual(tmp_path: Path) -> None:
    """Plain mode needs no norm: a checkpoint without the module's LayerNorm is read (X is the query projection's
    input); --from-residual names the missing tensor in one line, exit 2."""
    from safetensors.numpy import load_file, save_file

    got = _model("megatron-bert", tmp_path / "model")
    path = tmp_path / "model" / "model.safetensors"
    tensors = load_file(path)
    save_file({k: v for k, v in tensors.items() if f"layer.{LAYER}.attention.ln." not in k}, path,
              metadata={"format": "pt"})
    w, _ = _self(tmp_path / "model", got["x"], tmp_path)
    assert float(np.abs(w - got["weights"]).max()) < TOL
    np.save(tmp_path / "h.npy", got["h"].astype(np.float32))
    res = runner.invoke(app, ["self", str(tmp_path / "h.npy"), "--weights", str(tmp_path / "model"), "--layer",
                              str(LAYER), "--from-residual"])
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert "\n" not in line and f"layer.{LAYER}.attention.ln.weight" in line


def test_inspect_says_where_the_norm_sits(tmp_path: Path) -> None:
    """inspect --format json: norm_at is 'inside' for a pre-LN BERT, 'before' for Llama-style pre-norm is covered
    by its own tests; here the family whose norm is inside the attention module."""
    _model("xlm-roberta-xl", tmp_path / "model")
    res = runner.invoke(app, ["inspect", str(tmp_path / "model"), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    facts = json.loads(res.stdout)["stacks"][0]["facts"]
    assert facts["norm_at"] == "inside" and facts["pre_norm"] == "layernorm"
