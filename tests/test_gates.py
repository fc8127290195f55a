"""Output gates and the rotary BERTs (issue 20): each against its own transformers module.

- gate / gated (sigmoid, feature by feature): AFMoE's own AfmoeAttention on a full (NoPE) layer, whose forward
  multiplies the concatenated heads by sigmoid(gate_proj(x)) before o_proj; on the explicit, blocked and SDPA paths.
- gate / gated (softplus, per head and per feature): Laguna's own LagunaAttention (gating true / false), given
  cos 1 and sin 0 so that its rotary leaves q and k as they are; and a float64 loop written here for the step.
- readers: a tiny RoFormer, ESM (rotary), AFMoE, Laguna and Granite SWA, saved with save_pretrained, run by
  ``attncli self --weights`` on a layer's attention input and with --from-residual on hidden_states[N], against the
  module's own output (o_proj / output.dense) and attention weights.
- refusals in one line: RoFormer's rotary_value, a RoFormer table that is not the sinusoid, a gate of the wrong width.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core.engine import run
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.plan import Plan
from attncli.core.projections import Gate, Projections
from attncli.errors import InputError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

runner = CliRunner()
E, H, G, D, T = 32, 4, 2, 8, 9


def _randomise(module: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name.lower() and p.ndim == 1:
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            elif name.endswith("bias") or p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)


def _t(w: Any) -> np.ndarray:
    return w.detach().double().numpy().T  # nn.Linear (out, in) -> textbook (in, out)


def _causal() -> Any:
    return torch.from_numpy(np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf))[None, None].float()


def _layer(m: Any, x: np.ndarray, gate: Gate, o: Options) -> Layer:
    proj = Projections(**{f"W_{n}": _t(getattr(m, f"{n}_proj").weight) for n in "qkvo"},
                       q_norm=m.q_norm.weight.detach().double().numpy(), k_norm=m.k_norm.weight.detach().double().numpy())
    return Layer.build(x.astype(np.float32), projections=proj, heads=H, options=o, gate=gate)


def test_sigmoid_gate_is_afmoe_attention_on_every_path() -> None:
    from transformers import AfmoeConfig
    from transformers.models.afmoe.modeling_afmoe import AfmoeAttention

    cfg = AfmoeConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=D, num_hidden_layers=4,
                      rms_norm_eps=1e-5)
    cfg._attn_implementation = "eager"
    assert cfg.layer_types[3] == "full_attention"  # its full layers have no rotary
    m = AfmoeAttention(cfg, 3).eval()
    _randomise(m, 1)
    x = np.random.default_rng(1).normal(size=(1, T, E))
    with torch.no_grad():
        y, w = m(torch.from_numpy(x).float(), None, _causal())
    gate = Gate("sigmoid", _t(m.gate_proj.weight), "gate_proj.weight")
    o = Options(causal=True, qk_norm="rms", norm_eps=1e-5, dtype="float32", backend="torch")
    layer = _layer(m, x, gate, o)
    t = run(layer)
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)
    np.testing.assert_allclose(t.weights, w.numpy(), atol=1e-6)
    for path in ("blocked", "sdpa"):
        np.testing.assert_allclose(run(layer, Plan(path)).output, y.numpy(), atol=1e-5)
    names = t.names()
    assert names.index("concat") < names.index("W_g") < names.index("gate") < names.index("gated") < names.index("output")
    want = 1 / (1 + np.exp(-(x @ _t(m.gate_proj.weight))))  # float64: sigmoid(x W_g), one gate per feature
    np.testing.assert_allclose(t.step("gate").numpy(), want, atol=1e-6)
    assert "gated · W_o" in t.step("output").formula
    plain = run(Layer.build(x.astype(np.float32), projections=layer.projections, heads=H, options=o))
    assert np.abs(plain.output - y.numpy()).max() > 1e-2  # without the gate: other numbers


@pytest.mark.parametrize("gating", [True, False])
def test_softplus_gate_is_laguna_attention(gating: bool) -> None:
    from transformers import LagunaConfig
    from transformers.models.laguna.modeling_laguna import LagunaAttention

    cfg = LagunaConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=D, num_hidden_layers=2,
                       gating=gating, rms_norm_eps=1e-5)
    cfg._attn_implementation = "eager"
    m = LagunaAttention(cfg, 0, H).eval()
    _randomise(m, 2)
    assert m.g_proj.weight.shape == ((H, E) if gating else (H * D, E))
    x = np.random.default_rng(2).normal(size=(1, T, E))
    identity = (torch.ones(1, T, D), torch.zeros(1, T, D))  # cos 1, sin 0: its rotary leaves q and k unchanged
    with torch.no_grad():
        y, _ = m(torch.from_numpy(x).float(), identity, _causal())
    gate = Gate("softplus", _t(m.g_proj.weight), "g_proj.weight")
    t = run(_layer(m, x, gate, Options(causal=True, qk_norm="rms", norm_eps=1e-5, dtype="float32")))
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)
    z = x[0] @ _t(m.g_proj.weight)  # (T, n) float64
    g = np.log1p(np.exp(z))
    concat = t.step("concat").numpy()[0].astype(np.float64)
    want = np.empty_like(concat)
    for i in range(T):  # each head's d features times its gate (per head), or feature by feature
        for f in range(H * D):
            want[i, f] = concat[i, f] * (g[i, f // D] if gating else g[i, f])
    np.testing.assert_allclose(t.step("gated").numpy()[0], want, atol=1e-5)


def test_gate_of_the_wrong_width_is_one_line() -> None:
    x = np.random.default_rng(0).normal(size=(T, E))
    proj = Projections(W_q=np.eye(E), W_k=np.eye(E), W_v=np.eye(E), W_o=np.eye(E))
    with pytest.raises(InputError, match=r"W_g has shape \(32, 5\)"):
        Layer.build(x, projections=proj, heads=H, gate=Gate("softplus", np.ones((E, 5)), "g_proj.weight"))
    with pytest.raises(InputError, match="no W_o"):
        Layer.build(x, projections=Projections(W_q=np.eye(E), W_k=np.eye(E), W_v=np.eye(E)), heads=H,
                    gate=Gate("sigmoid", np.ones((E, H)), "gate_proj.weight"))
    with pytest.raises(InputError, match="activation"):
        Layer.build(x, projections=proj, heads=H, gate=Gate("tanh", np.ones((E, H)), "g_proj.weight"))


# ---- the readers: a tiny checkpoint of each family, save_pretrained, against its own modules ----------------------


def _tiny(mt: str, folder: Path, **over: Any) -> tuple[dict[str, np.ndarray], int]:
    """A 2-layer model of ``mt`` saved in ``folder``; layer 1's attention input, output and weights, hidden_states[1]."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForMaskedLM

    kw = dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=2, intermediate_size=32, vocab_size=40,
              max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cls = CONFIG_MAPPING[mt]
    default = cls()
    if hasattr(default, "num_key_value_heads"):
        kw.update(num_key_value_heads=G, head_dim=D, sliding_window=3)
    if hasattr(default, "num_experts"):  # a few small experts: quick to build
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    cfg = cls(**{**kw, **over})
    causal = mt in transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    model = (AutoModelForCausalLM if causal else AutoModelForMaskedLM).from_config(cfg, attn_implementation="eager")
    model.eval()
    _randomise(model, 3)
    for mod in model.modules():  # RoFormer's stored rotary table: the sinusoid, as in real checkpoints
        if type(mod).__name__ == "RoFormerSinusoidalPositionalEmbedding":
            with torch.no_grad():
                mod.weight.copy_(mod.create_weight())
    model.save_pretrained(folder)
    stack = next(s for _, s in model.named_modules() if isinstance(s, torch.nn.ModuleList) and len(s) == 2)
    attn = next(s for n, s in stack[1].named_modules() if n.split(".")[-1] in ("self_attn", "attention"))
    out = next(s for n, s in attn.named_modules() if n.split(".")[-1] in ("o_proj", "dense"))
    got: dict[str, Any] = {}

    def pre(m: Any, a: Any, k: Any) -> None:
        got.setdefault("x", a[0] if a else k["hidden_states"])

    def proj(m: Any, a: Any, r: Any) -> None:
        got.setdefault("y", r)

    # X is the query projection's input (issue 30): ESM's LayerNorm inside its attention module comes before it
    xin = attn.self.query if hasattr(attn, "LayerNorm") and hasattr(attn, "self") else attn
    hooks = [xin.register_forward_pre_hook(pre, with_kwargs=True), out.register_forward_hook(proj)]
    with torch.no_grad():
        res = model(input_ids=(torch.arange(T) * 5 + 3).remainder(37)[None] + 3, output_hidden_states=True,
                    output_attentions=True)
    for h in hooks:
        h.remove()
    got.update(w=res.attentions[1], h=res.hidden_states[1])  # layer 1's weights, its input residual stream
    arrays = {k: v[0].double().numpy() for k, v in got.items()}
    return arrays, 1


def _self(folder: Path, x: np.ndarray, layer: int, *extra: str) -> Any:
    path = folder.parent / "x.npy"
    np.save(path, x.astype(np.float32))
    return runner.invoke(app, ["self", str(path), "--weights", str(folder), "--layer", str(layer), "--format", "json",
                               *extra])


CASES = {
    "roformer": {},
    "esm": dict(position_embedding_type="rotary"),
    "afmoe": dict(layer_types=["full_attention", "sliding_attention"]),  # layer 1 slides, with rotary
    "laguna": dict(layer_types=["full_attention", "sliding_attention"], gating=True),
    "granite_swa": dict(layer_types=["full_attention", "sliding_attention"], layer_rope_theta=[0, 5000.0],
                        attention_multiplier=0.3),
}


@pytest.mark.parametrize("mt", list(CASES))
def test_checkpoint_agrees_with_its_module(mt: str, tmp_path: Path) -> None:
    """Plain (the module's input) and --from-residual (hidden_states[1]): the output within 1e-5 of the module's,
    the weights of HF's (Granite SWA: HF returns them before the sink's share; attncli's rows renormalised)."""
    a, layer = _tiny(mt, tmp_path / "m", **CASES[mt])
    for x, extra in ((a["x"], ()), (a["h"], ("--from-residual",))):
        res = _self(tmp_path / "m", x, layer, *extra)
        assert res.exit_code == 0, res.stderr
        doc = json.loads(res.stdout)
        w, y = np.array(doc["weights"]), np.array(doc["output"])
        if mt == "granite_swa":
            assert np.all(w.sum(-1) < 1)  # the sink's share
            w = w / w.sum(-1, keepdims=True)
        np.testing.assert_allclose(y, a["y"], atol=1e-5 * max(1.0, np.abs(a["y"]).max()))
        np.testing.assert_allclose(w, a["w"], atol=1e-5)


def _one_line(res: Any) -> str:
    assert res.exit_code == 2, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300, res.stderr
    return lines[0]


def test_roformer_rotary_value_is_refused(tmp_path: Path) -> None:
    a, layer = _tiny("roformer", tmp_path / "m", rotary_value=True)
    assert "rotary_value" in _one_line(_self(tmp_path / "m", a["x"], layer))


def test_roformer_table_that_is_not_the_sinusoid_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    a, layer = _tiny("roformer", tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    tensors = load_file(f)
    name = next(k for k in tensors if k.endswith("embed_positions.weight"))
    tensors[name] = tensors[name] * np.float32(1.01)
    save_file(tensors, f, metadata={"format": "pt"})
    assert "embed_positions.weight is not the sinusoidal" in _one_line(_self(tmp_path / "m", a["x"], layer))


def test_laguna_gate_width_must_agree_with_gating(tmp_path: Path) -> None:
    a, layer = _tiny("laguna", tmp_path / "m", layer_types=["full_attention"] * 2, gating=True)
    cfg = tmp_path / "m" / "config.json"
    doc = json.loads(cfg.read_text())
    doc["gating"] = False  # one gate per feature, but g_proj holds one per head
    cfg.write_text(json.dumps(doc))
    assert "g_proj.weight has 4 outputs but config.json gating = False" in _one_line(_self(tmp_path / "m", a["x"], layer))


def test_sliding_family_without_layer_types_is_refused(tmp_path: Path) -> None:
    """Laguna's config class makes every layer full without layer_types, AFMoE's every fourth: attncli does not guess."""
    a, layer = _tiny("laguna", tmp_path / "m", layer_types=["full_attention"] * 2)
    cfg = tmp_path / "m" / "config.json"
    doc = json.loads(cfg.read_text())
    del doc["layer_types"]
    cfg.write_text(json.dumps(doc))
    assert "has no layer_types" in _one_line(_self(tmp_path / "m", a["x"], layer))
