"""DeepSeek's multi-head latent attention (MLA, issue 20) against transformers' own modules.

Each case builds a tiny model (DeepseekV3 / DeepseekV2 / MiniCPM3) from a random config, randomises its weights
(norm weights away from 1, biases non-zero), saves it with save_pretrained, and captures what a layer's
*Attention module received (hidden_states), returned (output, eager weights) and the residual stream entering the
layer (hidden_states[N]). attncli reads the folder (attncli.io.model.load_layer) and must give the module's
weights and output within 1e-5, plain and --from-residual. The steps q_latent_norm, kv_latent, kv_latent_norm,
k_nope and v are compared with the module's own q_a_layernorm(q_a_proj(x)), kv_a_proj_with_mqa(x), ... computed
here with its submodules.
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
from attncli.errors import InputError
from attncli.io.model import load_layer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

runner = CliRunner()
E, H, T, LAYERS = 32, 4, 9, 2
BASE = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=H, num_hidden_layers=LAYERS,
            intermediate_size=48, moe_intermediate_size=16, vocab_size=64, max_position_embeddings=64,
            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=4, v_head_dim=10, n_routed_experts=4,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=LAYERS, rms_norm_eps=1e-5)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "v3-q-lora-interleaved": ("deepseek_v3", dict(q_lora_rank=24)),
    "v3-q-proj-half": ("deepseek_v3", dict(q_lora_rank=None, rope_interleave=False)),
    "v3-yarn-mscale-bias": ("deepseek_v3", dict(q_lora_rank=24, attention_bias=True, rope_parameters=YARN)),
    "v2-complex-pairs": ("deepseek_v2", dict(q_lora_rank=24)),
    "v2-q-proj": ("deepseek_v2", dict(q_lora_rank=None)),
    "minicpm3-half": ("minicpm3", dict(q_lora_rank=24)),
    # DeepSeek-V2's own rope_scaling (mscale = mscale_all_dim = 0.707): the scale times mscale², cos/sin unscaled
    "v2-yarn-as-released": ("deepseek_v2", dict(q_lora_rank=24, rope_parameters=dict(
        YARN, mscale=0.707, mscale_all_dim=0.707, factor=40.0))),
}


def _randomise(model: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)


def _build(mt: str, over: dict[str, Any], folder: Path, layer: int = 1) -> dict[str, Any]:
    """The tiny model saved in ``folder``; what layer ``layer``'s attention saw and returned."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    cfg = CONFIG_MAPPING[mt](**{**BASE, **over})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    _randomise(model, 3)
    model.save_pretrained(folder, safe_serialization=True)
    attn = model.model.layers[layer].self_attn
    seen: dict[str, Any] = {}

    def hook(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        seen["x"] = (kwargs.get("hidden_states", args[0] if args else None)).detach()
        seen["y"], seen["w"] = out[0].detach(), out[1].detach()

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    ids = torch.randint(3, 64, (1, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True, output_attentions=True).hidden_states
    handle.remove()
    seen["h"] = hs[layer].detach()
    seen["attn"] = attn
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_mla_layer_is_the_hf_module(case: str, tmp_path: Path) -> None:
    mt, over = CASES[case]
    got = _build(mt, over, tmp_path)
    layer = load_layer(tmp_path, 1)
    x = got["x"][0].double().numpy()  # (T, E): the module's own input
    t = run(layer.problem(x))
    from attncli.core.trace import StepName

    assert set(t.names()) <= {s.value for s in StepName}  # every latent step is one `check --what` accepts
    np.testing.assert_allclose(t.output, got["y"][0].numpy(), atol=1e-5)
    np.testing.assert_allclose(t.weights, got["w"][0].numpy(), atol=1e-5)
    r = run(layer.problem(got["h"][0].double().numpy(), from_residual=True))  # hidden_states[1], input_layernorm first
    np.testing.assert_allclose(r.output, got["y"][0].numpy(), atol=1e-5)
    np.testing.assert_allclose(r.weights, got["w"][0].numpy(), atol=1e-5)

    m, xt = got["attn"], got["x"]
    with torch.no_grad():  # the latent steps, against the module's own submodules
        kv = m.kv_a_proj_with_mqa(xt)
        c = m.kv_a_layernorm(kv[..., :16])
        k_nope, v = m.kv_b_proj(c).view(1, T, H, 4 + 10).split([4, 10], dim=-1)
        np.testing.assert_allclose(t.step("kv_latent").numpy(), kv[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(t.step("kv_latent_norm").numpy(), c[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(t.step("k_nope").numpy(), k_nope[0].reshape(T, -1).numpy(), atol=1e-5)
        np.testing.assert_allclose(t.step("v").numpy(), v[0].reshape(T, -1).numpy(), atol=1e-5)
        if over.get("q_lora_rank"):
            ql = m.q_a_layernorm(m.q_a_proj(xt))
            np.testing.assert_allclose(t.step("q_latent_norm").numpy(), ql[0].numpy(), atol=1e-5)
        else:
            assert "q_latent" not in t.names()
    # each head's k: [k_pe | k_nope_h], k_pe (kv_latent's last 8 features) the same in every head
    k = t.step("k").numpy().reshape(T, H, 12)
    np.testing.assert_allclose(k[:, :, :8], np.broadcast_to(kv[0, :, 16:].numpy()[:, None], (T, H, 8)), atol=1e-6)
    assert t.meta.rope is not None and t.meta.rope.rotary_dim == 8
    want = "half" if over.get("rope_interleave") is False or mt == "minicpm3" else "interleaved"
    assert t.meta.rope.mode == want


def test_mla_bfloat16_checkpoint_is_the_module_in_bfloat16_weights(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    got = _build("deepseek_v3", dict(q_lora_rank=24), tmp_path / "f32")
    pe = AutoModelForCausalLM.from_pretrained(tmp_path / "f32").model.rotary_emb(got["x"], torch.arange(T)[None])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "f32").to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16", safe_serialization=True)
    ref = model.to(torch.float32).model.layers[1].self_attn  # the bf16 weights, computed in float32
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        y, _ = ref(got["x"], pe, mask)
    layer = load_layer(tmp_path / "bf16", 1)
    assert layer.projections.latent is not None and layer.projections.latent.W_kva.dtype == np.float32
    t = run(layer.problem(got["x"][0].numpy()))
    np.testing.assert_allclose(t.output, y[0].numpy(), atol=1e-5)


def _edit(folder: Path, **changes: Any) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, culprit", [
    (dict(model_type="deepseek_v32"), "deepseek_v32: multi-head latent attention"),
    (dict(num_key_value_heads=2), "num_key_value_heads 2 differs"),
    (dict(head_dim=4), "head_dim 4 differs from qk_rope_head_dim 8"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(kv_lora_rank=12), "kv_b_proj.weight"),
])
def test_mla_refuses_what_it_does_not_compute(changes: dict[str, Any], culprit: str, tmp_path: Path) -> None:
    _build("deepseek_v3", dict(q_lora_rank=24), tmp_path)
    _edit(tmp_path, **changes)
    with pytest.raises(InputError, match=culprit):
        load_layer(tmp_path, 1)


def test_mla_is_self_attention_only(tmp_path: Path) -> None:
    _build("deepseek_v3", dict(q_lora_rank=24), tmp_path)
    x = np.random.default_rng(0).normal(size=(T, E))
    with pytest.raises(InputError, match="self-attention only"):
        load_layer(tmp_path, 1).problem(x, memory=x + 1)


def test_cli_self_on_a_deepseek_v3_folder(tmp_path: Path) -> None:
    got = _build("deepseek_v3", dict(q_lora_rank=24), tmp_path / "model")
    np.save(tmp_path / "h.npy", got["h"][0].numpy())
    res = runner.invoke(app, ["self", str(tmp_path / "h.npy"), "--weights", str(tmp_path / "model"), "--layer", "1",
                              "--from-residual", "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    np.testing.assert_allclose(np.asarray(out["output"]), got["y"][0].numpy(), atol=1e-5)
    names = [s["name"] for s in out["steps"]]
    assert names.index("q_latent") < names.index("q_latent_norm") < names.index("q") < names.index("kv_latent") \
        < names.index("kv_latent_norm") < names.index("k_nope") < names.index("k") < names.index("v")


def test_cli_wrong_heads_is_one_line_naming_heads(tmp_path: Path) -> None:
    got = _build("deepseek_v3", dict(q_lora_rank=24), tmp_path / "model")
    np.save(tmp_path / "x.npy", got["x"][0].numpy())
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "model"), "--layer", "1",
                              "--heads", "2", "--format", "json"])
    assert res.exit_code == 2 and res.stdout == ""
    assert "--heads" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_check_finds_the_module_output_and_not_a_scaled_one(tmp_path: Path) -> None:
    got = _build("deepseek_v3", dict(q_lora_rank=24), tmp_path / "model")
    np.save(tmp_path / "x.npy", got["x"][0].numpy())
    for name, factor, code in (("y", 1.0, 0), ("bad", 1.01, 1)):
        np.save(tmp_path / f"{name}.npy", got["y"][0].numpy() * factor)
        res = runner.invoke(app, ["check", str(tmp_path / f"{name}.npy"), str(tmp_path / "x.npy"), "--weights",
                                  str(tmp_path / "model"), "--layer", "1", "--format", "json"])
        assert res.exit_code == code, res.stderr[-300:]
