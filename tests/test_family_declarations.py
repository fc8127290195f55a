"""A family that reuses a layout is a declaration, no code (issue 30, item 5): a new model_type declared with a
Family row reads as the model it describes, its sliding rule included (no table outside Family to edit)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_layouts import build  # noqa: E402

from attncli.core.engine import run  # noqa: E402
from attncli.io import families  # noqa: E402
from attncli.io.model import load_layer  # noqa: E402

TOL = 1e-5


def test_a_new_family_is_one_declaration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 2's checkpoint saved under a model_type attncli has never heard of ("gemma2-like"), its config.json
    without layer_types: refused until declared; declared in one row (Gemma 2's fields and its even-layers sliding
    rule), layer 0 slides and layer 1 does not (Gemma2Config's rule), and both agree with the model's own
    attention (transformers' output_attentions)."""
    folder = tmp_path / "model"
    got = {n: build("gemma2", folder, layer=n)[1] for n in (1, 0)}  # the same weights (seeded by name), each layer
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("layer_types", None)
    cfg["model_type"] = "gemma2-like"
    cfg_path.write_text(json.dumps(cfg))
    from attncli.errors import InputError

    with pytest.raises(InputError, match="gemma2-like"):
        load_layer(folder, 0)
    row = families.Family("gemma2-like", slides=families.FAMILIES["gemma2"].slides, **families.GEMMA2)  # the row
    monkeypatch.setitem(families.FAMILIES, "gemma2-like", row)
    for n, want_window in ((0, 4), (1, None)):
        layer = load_layer(folder, n)
        assert layer.options.get("window") == want_window
        trace = run(layer.problem(got[n]["x"]))
        assert float(np.abs(np.asarray(trace["weights"], np.float64) - got[n]["weights"]).max()) < TOL
        assert float(np.abs(np.asarray(trace["output"], np.float64) - got[n]["y"]).max()) < TOL


def test_a_new_layout_is_one_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor layout is a declared row (issue 30, item 5): BERT's attention saved under other tensor names
    (stack.blocks.N.mix.{wq, wk, wv, wo}, its post-norm mix.norm) is no layout attncli knows; one row naming the
    tensors and one Family row make it read as the model it is, and layer 1 agrees with transformers' own BertModel
    (its attention module's input, per-head weights from output_attentions, and output projection's output)."""
    from safetensors.numpy import load_file, save_file

    from attncli.errors import InputError
    from attncli.io import layouts

    folder = tmp_path / "model"
    _, got = build("bert", folder)  # layer 1 of a tiny random BertModel, saved with save_pretrained
    renames = {"attention.self.query": "mix.wq", "attention.self.key": "mix.wk", "attention.self.value": "mix.wv",
               "attention.output.dense": "mix.wo", "attention.output.LayerNorm": "mix.norm"}
    tensors = {}
    for name, a in load_file(folder / "model.safetensors").items():
        for old, new in renames.items():
            if f".{old}." in name:
                name = name.replace("encoder.layer.", "stack.blocks.").replace(old, new)
        tensors[name] = a
    (folder / "model.safetensors").unlink()
    save_file(tensors, folder / "model.safetensors")
    cfg_path = folder / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "model_type": "bertish"}))
    with pytest.raises(InputError):
        load_layer(folder, 1)
    monkeypatch.setattr(layouts, "LAYOUTS", dict(layouts.LAYOUTS))  # the registry, restored after the test
    layouts.row_layout("bertish", r"^(?P<stack>(?:.*\.)?blocks\.)(?P<n>\d+)\.mix\.wq\.weight$", "BERT, renamed",
                       layouts.Row("bertish", "mix.", "wq", "wk", "wv", "wo", post_norm="mix.norm"))  # the layout
    monkeypatch.setitem(families.FAMILIES, "bertish", families.Family(  # the family
        "bertish", layout="bertish", rope=None, pre_norm=None, causal=False))
    layer = load_layer(folder, 1)
    assert layer.layout == "bertish" and layer.raw.origin["W_q"] == "stack.blocks.1.mix.wq.weightᵀ"
    trace = run(layer.problem(got["x"]))
    assert float(np.abs(np.asarray(trace["weights"], np.float64) - got["weights"]).max()) < TOL
    assert float(np.abs(np.asarray(trace["output"], np.float64) - got["y"]).max()) < TOL
