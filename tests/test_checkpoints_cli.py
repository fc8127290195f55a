"""`attncli self --weights MODEL --layer N` on real checkpoints, against the models that wrote them.

Each case is a tiny transformers model from a random config (tests/test_layouts.py ``build``:
no downloads), saved with ``save_pretrained`` and run once with hooks on the attention module's
input and output projection and ``output_attentions``. The CLI must reproduce the module's
per-head weights and its output from the saved folder within 1e-5 (float32), from the module's
input and, with ``--from-residual``, from ``hidden_states[N]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_layouts import CASES, T, build, hooks, tiny_t5  # noqa: E402

from attncli.cli import app  # noqa: E402

runner = CliRunner()
TOL = 1e-5
ERRORS: dict[str, float] = {}  # the largest error per case (printed by the last test with -s)


def _self(args: list[str]) -> dict[str, Any]:
    res = runner.invoke(app, ["self", *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _compare(name: str, doc: dict[str, Any], got: dict[str, Any]) -> None:
    w = np.array(doc["weights"], dtype=np.float64)  # (H, T, T): one sequence, every head
    y = np.array(doc["output"], dtype=np.float64)  # (T, E)
    err = max(float(np.abs(w - got["weights"]).max()), float(np.abs(y - got["y"]).max()))
    ERRORS[name] = max(err, ERRORS.get(name, 0.0))
    assert w.shape == got["weights"].shape and y.shape == got["y"].shape
    assert err < TOL, f"{name}: differs by {err}"


@pytest.mark.parametrize("name", list(CASES))
def test_self_reproduces_the_layer(name: str, tmp_path: Path) -> None:
    _, got = build(name, tmp_path / "model")
    np.save(tmp_path / "x.npy", got["x"].astype(np.float32))
    np.save(tmp_path / "h.npy", got["hidden"].astype(np.float32))
    layer = str(got["layer"])
    _compare(name, _self([str(tmp_path / "x.npy"), "--weights", str(tmp_path / "model"), "--layer", layer]), got)
    doc = _self([str(tmp_path / "h.npy"), "--weights", str(tmp_path / "model"), "--layer", layer, "--from-residual"])
    _compare(f"{name} --from-residual", doc, got)


def test_sharded_and_bfloat16_checkpoints(tmp_path: Path) -> None:
    model, got = build("llama", tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    np.save(tmp_path / "x.npy", got["x"].astype(np.float32))
    layer = str(got["layer"])
    _compare("llama sharded", _self([str(tmp_path / "x.npy"), "--weights", str(tmp_path / "sharded"), "--layer", layer]),
             got)
    # bfloat16: the module itself in bfloat16 is the reference, within bfloat16's rounding
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    doc = _self([str(tmp_path / "x.npy"), "--weights", str(tmp_path / "bf16"), "--layer", layer])
    attn = model.model.layers[got["layer"]].self_attn.float()
    ref = build_reference_output(attn, got["x"], model.config)
    np.testing.assert_allclose(np.array(doc["output"]), ref, atol=5e-5)


def build_reference_output(attn: Any, x: np.ndarray, config: Any) -> np.ndarray:
    """The (bf16-rounded, float32-computed) Llama attention module's own output on x."""
    xt = torch.from_numpy(x).float()[None]
    pos = torch.arange(x.shape[0])[None]
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    cos, sin = rotary(xt, pos)
    mask = torch.full((x.shape[0], x.shape[0]), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out, _ = attn(xt, position_embeddings=(cos, sin), attention_mask=mask)
    return out[0].double().numpy()


def test_check_takes_a_checkpoint_layer(tmp_path: Path) -> None:
    _, got = build("gpt2", tmp_path / "model")
    np.save(tmp_path / "x.npy", got["x"].astype(np.float32))
    np.save(tmp_path / "y.npy", got["y"].astype(np.float32))
    base = ["check", str(tmp_path / "y.npy"), str(tmp_path / "x.npy"), "--weights", str(tmp_path / "model"),
            "--layer", str(got["layer"])]
    res = runner.invoke(app, base)
    assert res.exit_code == 0, res.output
    wrong = got["y"].copy()
    wrong[3] *= 1.01
    np.save(tmp_path / "y.npy", wrong.astype(np.float32))
    assert runner.invoke(app, base).exit_code == 1


def test_t5_encoder_layer_with_its_position_bias(tmp_path: Path) -> None:
    model = tiny_t5(tmp_path / "t5")
    attn = model.encoder.block[1].layer[0].SelfAttention
    got: dict[str, Any] = {}
    h1, h2 = hooks(attn, attn.o, got)
    ids = (torch.arange(T)[None] * 7) % 50
    with torch.no_grad():
        res = model(input_ids=ids, decoder_input_ids=ids, output_attentions=True)
    h1.remove()
    h2.remove()
    got.update(weights=res.encoder_attentions[1][0].double().numpy(), y=got["y"][0].double().numpy())
    np.save(tmp_path / "x.npy", got["x"][0].float().numpy())
    doc = _self([str(tmp_path / "x.npy"), "--weights", str(tmp_path / "t5"), "--layer", "1", "--prefix", "encoder"])
    _compare("t5 encoder", doc, got)


def test_transformer_lens_state_dict(tmp_path: Path) -> None:
    """A HookedTransformer (GQA, rotary) saved as its state dict: self vs hook_pattern and hook_attn_out,
    from the residual stream hook_resid_pre with --from-residual."""
    from test_checkpoint import hooked_transformer

    _, cache = hooked_transformer(tmp_path / "tl.pt")
    np.save(tmp_path / "h.npy", cache["blocks.1.hook_resid_pre"][0].float().numpy())
    doc = _self([str(tmp_path / "h.npy"), "--weights", str(tmp_path / "tl.pt"), "--layer", "1", "--from-residual"])
    got = {"weights": cache["blocks.1.attn.hook_pattern"][0].double().numpy(),
           "y": cache["blocks.1.hook_attn_out"][0].double().numpy()}
    _compare("transformer-lens --from-residual", doc, got)


@pytest.mark.parametrize(("args", "message"), [
    (["--layer", "7"], "has no layer 7"),
    ([], "choose one with --layer"),
])
def test_layer_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    _, got = build("gpt2", tmp_path / "model")
    np.save(tmp_path / "x.npy", got["x"].astype(np.float32))
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "model"), *args])
    assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output


@pytest.fixture(scope="module", autouse=True)
def _report_errors() -> Any:
    """After this file's tests, the largest error per case (shown with pytest -s); not a test."""
    yield
    for name, err in sorted(ERRORS.items()):
        print(f"{name:32} {err:.2e}")
