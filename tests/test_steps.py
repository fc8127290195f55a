"""The steps OLMo, BitNet and Llama 4 add (issue 20): each against an independent reference.

- clip (q_clip, k_clip, v_clip): OLMo's own OlmoAttention module (transformers), whose forward clamps its
  projections with clip_qkv; and torch.clamp of the projections written here.
- sub_norm: BitNet's own BitNetAttention module (its attn_sub_norm, a BitNetRMSNorm, before o_proj).
- the chunked mask (--chunk): a plain loop over (query, key) in float64 written here, on the explicit, blocked
  and torch SDPA paths; and Llama4TextAttention on a RoPE layer given HF's own chunked mask
  (masking_utils.create_chunked_causal_mask), which also checks its interleaved (complex) rotary.
- q_temp (--tuning-scale, --tuning-floor): Llama4TextAttention on a NoPE layer with attn_temperature_tuning, whose
  forward evaluates log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1 itself.
- the CLI: the new options, and one line with exit 2 for bad values; llama4_text with use_qk_norm read as the model computes it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core.engine import attend, run
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.projections import Norm, Projections

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

runner = CliRunner()
E, H, G, D, T = 32, 4, 2, 8, 11


def _randomise(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)


def _projections(m: torch.nn.Module) -> Projections:
    """The module's q/k/v/o_proj as textbook (in, out) matrices."""
    w = {f"W_{n}": getattr(m, f"{n}_proj").weight.detach().double().numpy().T for n in "qkvo"}
    return Projections(**w)


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(1, T, E))


def _causal_additive(keep: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.where(keep, 0.0, -np.inf))[None, None].float()


def _plain_chunked(m: int, n: int, chunk: int, offset: int = 0, window: int | None = None) -> np.ndarray:
    keep = np.zeros((m, n), bool)
    for i in range(m):
        p = offset + i
        for j in range(n):
            keep[i, j] = j <= p and j // chunk == p // chunk and (window is None or j > p - window)
    return keep


def _plain_softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """float64 loops: softmax over the kept keys of q_i·k_j/√d, times V."""
    m, d = q.shape
    out = np.zeros((m, v.shape[1]))
    for i in range(m):
        s = [q[i] @ k[j] / math.sqrt(d) for j in range(k.shape[0]) if keep[i, j]]
        js = [j for j in range(k.shape[0]) if keep[i, j]]
        mx = max(s)
        e = [math.exp(x - mx) for x in s]
        for j, w in zip(js, e):
            out[i] += w / sum(e) * v[j]
    return out


# ---- the chunked mask ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk,offset,window", [(4, 0, None), (3, 5, None), (1, 0, None), (5, 2, 3), (20, 0, None)])
def test_chunked_mask_is_the_plain_loop(chunk: int, offset: int, window: int | None) -> None:
    rng = np.random.default_rng(chunk)
    m, n = 7, 7 + offset
    q, k, v = rng.normal(size=(m, 6)), rng.normal(size=(n, 6)), rng.normal(size=(n, 5))
    keep = _plain_chunked(m, n, chunk, offset, window)
    t = attend(q, k, v, chunk=chunk, q_offset=offset or None, window=window)
    np.testing.assert_array_equal(t.weights > 0, keep)
    np.testing.assert_allclose(t.output, _plain_softmax_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)
    assert "chunked" in t.step("masked").formula and t.step("masked").params.chunk == chunk
    blocked = attend(q, k, v, chunk=chunk, q_offset=offset or None, window=window, keep_weights=False)
    assert blocked.meta.path == "blocked"
    np.testing.assert_allclose(blocked.output, t.output, rtol=1e-12, atol=1e-12)


def test_chunked_mask_on_the_sdpa_path_is_the_plain_loop() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(1, 2, 9, 4)), rng.normal(size=(1, 2, 9, 4)), rng.normal(size=(1, 2, 9, 4))
    keep = _plain_chunked(9, 9, 4)
    t = attend(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), chunk=4, backend="torch",
               keep_weights=False)
    assert t.meta.path == "sdpa"
    want = np.stack([_plain_softmax_attention(q[0, h], k[0, h], v[0, h], keep) for h in range(2)])[None]
    np.testing.assert_allclose(t.output, want, rtol=1e-5, atol=1e-5)


def test_chunked_mask_is_hf_chunked_overlay() -> None:
    from transformers import Llama4TextConfig
    from transformers.masking_utils import create_chunked_causal_mask

    cfg = Llama4TextConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=D,
                           num_hidden_layers=1, attention_chunk_size=4)
    cfg._attn_implementation = "eager"
    mask = create_chunked_causal_mask(config=cfg, inputs_embeds=torch.zeros(1, T, E), attention_mask=None,
                                      past_key_values=None, position_ids=torch.arange(T)[None])
    hf_keep = (mask[0, 0] == 0).numpy() if mask.dtype != torch.bool else mask[0, 0].numpy()
    ours = attend(np.random.default_rng(0).normal(size=(T, 4)), chunk=4).weights > 0
    np.testing.assert_array_equal(ours, hf_keep)


# ---- OLMo's clamp -------------------------------------------------------------------------------------------


def test_clip_is_olmo_attention() -> None:
    from transformers import OlmoConfig
    from transformers.models.olmo.modeling_olmo import OlmoAttention, OlmoRotaryEmbedding

    cfg = OlmoConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=D, clip_qkv=0.4)
    cfg._attn_implementation = "eager"
    m = OlmoAttention(cfg, 0).eval()
    _randomise(m, 0)
    x = _x()
    xt = torch.from_numpy(x).float()
    pe = OlmoRotaryEmbedding(cfg)(xt, torch.arange(T)[None])
    keep = np.tril(np.ones((T, T), bool))
    with torch.no_grad():
        y, w = m(xt, pe, _causal_additive(keep))
    o = Options(clip_qkv=0.4, rope="half", causal=True, rope_base=float(cfg.rope_parameters["rope_theta"]),
                dtype="float32")
    t = run(Layer.build(x.astype(np.float32), projections=_projections(m), heads=H, options=o))
    np.testing.assert_allclose(t.weights, w.numpy(), atol=1e-5)
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)
    q_proj = torch.clamp(torch.from_numpy(x) @ m.q_proj.weight.detach().double().T, -0.4, 0.4).numpy()  # torch.clamp, here
    np.testing.assert_allclose(t.step("q_clip").numpy(), q_proj, atol=1e-5)
    assert max(np.abs(t.step(n).numpy()).max() for n in ("q_clip", "k_clip", "v_clip")) <= 0.4
    assert np.abs(t.step("q").numpy()).max() > 0.4  # the clamp did something
    names = t.names()
    assert names.index("v") < names.index("q_clip") < names.index("k_clip") < names.index("v_clip") < names.index("scores")
    assert t.step("v_clip").params.c == 0.4 and "clamp(v, -0.4, 0.4)" in t.step("v_clip").formula


# ---- BitNet's sub-norm --------------------------------------------------------------------------------------


def test_sub_norm_is_bitnet_attention() -> None:
    from transformers import BitNetConfig
    from transformers.models.bitnet.modeling_bitnet import BitNetAttention, BitNetRotaryEmbedding

    cfg = BitNetConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, rms_norm_eps=1e-5)
    cfg._attn_implementation = "eager"
    m = BitNetAttention(cfg, 0).eval()
    assert all(type(getattr(m, f"{n}_proj")) is torch.nn.Linear for n in "qkvo")  # plain nn.Linear, unquantised
    _randomise(m, 1)
    x = _x(1)
    xt = torch.from_numpy(x).float()
    pe = BitNetRotaryEmbedding(cfg)(xt, torch.arange(T)[None])
    with torch.no_grad():
        y, w = m(xt, pe, _causal_additive(np.tril(np.ones((T, T), bool))))
    sub = Norm("rms", m.attn_sub_norm.weight.detach().double().numpy(), None, 1e-5, "attn_sub_norm.weight")
    o = Options(rope="half", causal=True, rope_base=float(cfg.rope_parameters["rope_theta"]), dtype="float32")
    t = run(Layer.build(x.astype(np.float32), projections=_projections(m), heads=H, options=o, sub_norm=sub))
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)
    with torch.no_grad():  # the step itself: HF's BitNetRMSNorm of our concat
        want = m.attn_sub_norm(torch.from_numpy(t.step("concat").numpy()).float()).numpy()
    np.testing.assert_allclose(t.step("sub_norm").numpy(), want, atol=1e-6)
    names = t.names()
    assert names.index("concat") < names.index("sub_norm") < names.index("output")
    assert "sub_norm · W_o" in t.step("output").formula
    from attncli.errors import InputError

    with pytest.raises(InputError, match="sub-norm"):  # a sub-norm whose width is not the heads' concat's
        Layer.build(x, projections=_projections(m), heads=H, sub_norm=Norm("rms", np.ones(E + 1), None, 1e-5))


# ---- Llama 4: interleaved rotary + chunked layers, temperature tuning on NoPE layers -----------------------


def _llama4(use_rope: bool) -> tuple[object, object, object]:
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    cfg = Llama4TextConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=D,
                           num_hidden_layers=1, no_rope_layers=[int(use_rope)], attention_chunk_size=4,
                           use_qk_norm=False, attn_temperature_tuning=True, floor_scale=3, attn_scale=0.7)
    cfg._attn_implementation = "eager"
    m = Llama4TextAttention(cfg, 0).eval()
    _randomise(m, 2)
    return cfg, m, Llama4TextRotaryEmbedding(cfg)


def test_llama4_rope_layer_is_interleaved_rotary_with_chunks() -> None:
    from transformers.masking_utils import create_chunked_causal_mask

    cfg, m, rot = _llama4(True)
    x = _x(2)
    xt = torch.from_numpy(x).float()
    mask = create_chunked_causal_mask(config=cfg, inputs_embeds=xt, attention_mask=None, past_key_values=None,
                                      position_ids=torch.arange(T)[None])
    with torch.no_grad():
        y, w = m(xt, rot(xt, torch.arange(T)[None]), mask)
    o = Options(rope="interleaved", chunk=4, causal=True, rope_base=float(cfg.rope_parameters["rope_theta"]),
                dtype="float32")
    t = run(Layer.build(x.astype(np.float32), projections=_projections(m), heads=H, options=o))
    np.testing.assert_allclose(t.weights, w.numpy(), atol=1e-5)
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)


def test_llama4_nope_layer_temperature_tuning() -> None:
    cfg, m, _ = _llama4(False)
    x = _x(3)
    xt = torch.from_numpy(x).float()
    with torch.no_grad():
        y, w = m(xt, None, _causal_additive(np.tril(np.ones((T, T), bool))))
    o = Options(causal=True, tuning_scale=0.7, tuning_floor=3, dtype="float32")
    t = run(Layer.build(x.astype(np.float32), projections=_projections(m), heads=H, options=o))
    np.testing.assert_allclose(t.weights, w.numpy(), atol=1e-5)
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)
    q, qt = t.step("q").numpy(), t.step("q_temp").numpy()  # (T, H·d) and (H, T, d)
    factor = qt[0, 0, :, 0] / q[0, :, 0]
    want = [math.log(math.floor((i + 1) / 3) + 1) * 0.7 + 1 for i in range(T)]  # the paper's formula, by hand
    np.testing.assert_allclose(factor, want, rtol=1e-5)
    assert t.step("q_temp").params.scale == 0.7
    untuned = run(Layer.build(x.astype(np.float32), projections=_projections(m), heads=H,
                              options=Options(causal=True, dtype="float32")))
    assert np.abs(untuned.output - y.numpy()).max() > 1e-3  # the tuning matters here


def test_temperature_tuning_on_run_at_an_offset() -> None:
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 4))
    t = attend(q, k, v, causal=True, q_offset=5, tuning_scale=0.5, tuning_floor=2)
    f = np.array([math.log(math.floor((5 + i + 1) / 2) + 1) * 0.5 + 1 for i in range(3)])
    keep = np.arange(8)[None, :] <= 5 + np.arange(3)[:, None]
    np.testing.assert_allclose(t.output, _plain_softmax_attention(q * f[:, None], k, v, keep), rtol=1e-6)
    out = attend(q, k, v, causal=True, q_offset=5, tuning_scale=0.5, tuning_floor=2, keep_weights=False)
    np.testing.assert_allclose(out.output, t.output, rtol=1e-12)


# ---- the command line ---------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    for name, shape in (("q", (1, 2, 9, 4)), ("k", (1, 2, 9, 4)), ("v", (1, 2, 9, 4)), ("x", (6, 8))):
        np.save(tmp_path / f"{name}.npy", rng.normal(size=shape))
    w = {"W_q": rng.normal(size=(8, 8)), "W_k": rng.normal(size=(8, 8)), "W_v": rng.normal(size=(8, 8))}
    np.savez(tmp_path / "w.npz", **w)
    return tmp_path


def test_cli_run_chunk(files: Path) -> None:
    res = runner.invoke(app, ["run", str(files / "q.npy"), str(files / "k.npy"), str(files / "v.npy"), "--chunk", "4",
                              "--format", "json"])
    assert res.exit_code == 0, res.stderr
    w = np.array(json.loads(res.stdout)["weights"])
    np.testing.assert_array_equal(w[0, 0] > 0, _plain_chunked(9, 9, 4))


def test_cli_self_clip_qkv(files: Path) -> None:
    res = runner.invoke(app, ["self", str(files / "x.npy"), "--weights", str(files / "w.npz"), "--heads", "2",
                              "--clip-qkv", "0.5", "--format", "json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    steps = {s["name"]: s for s in doc["steps"]}
    x, W = np.load(files / "x.npy"), np.load(files / "w.npz")
    np.testing.assert_allclose(np.array(steps["k_clip"]["values"]), np.clip(x @ W["W_k"], -0.5, 0.5), atol=1e-12)


def _main(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """The installed entry point (its one-line usage errors), in this process: exit code and stderr."""
    from attncli.cli import main

    monkeypatch.setattr(sys, "argv", ["attncli", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("args,culprit", [
    (["--chunk", "0"], "--chunk"), (["--chunk", "2.5"], "--chunk"), (["--tuning-floor", "0"], "--tuning-floor"),
    (["--tuning-scale", "nan"], "--tuning-scale")])
def test_cli_bad_values_run(files: Path, args: list[str], culprit: str, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    code, err = _main(["run", str(files / "q.npy"), str(files / "k.npy"), str(files / "v.npy"), *args], capsys,
                      monkeypatch)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and len(lines[0]) < 300


@pytest.mark.parametrize("value", ["0", "-1", "inf", "x"])
def test_cli_bad_clip(files: Path, value: str, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    code, err = _main(["self", str(files / "x.npy"), "--weights", str(files / "w.npz"), "--heads", "2", "--clip-qkv",
                       value], capsys, monkeypatch)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--clip-qkv" in lines[0]


def test_clip_is_not_a_run_option(files: Path) -> None:
    res = runner.invoke(app, ["run", str(files / "q.npy"), "--clip-qkv", "1"])
    assert res.exit_code == 2 and "--clip-qkv" in res.stderr


@pytest.mark.slow
def test_llama4_text_with_its_qk_norm_agrees_with_the_model(tmp_path: Path) -> None:
    """use_qk_norm (Llama 4's L2 norm of q and k after RoPE, on its RoPE layers only): the checkpoint read through
    the CLI gives the attention module's own per-head weights and output, on a RoPE layer (chunked, normed) and a
    NoPE layer (full, tuned, no norm); reading it without the norm would differ (the norm matters here)."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    cfg = Llama4TextConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=D, num_hidden_layers=2,
                           intermediate_size=16, intermediate_size_mlp=16, vocab_size=32, num_local_experts=2,
                           use_qk_norm=True, attention_chunk_size=4, no_rope_layers=[1, 0],
                           attn_temperature_tuning=True, floor_scale=3, attn_scale=0.7)
    cfg._attn_implementation = "eager"
    model = Llama4ForCausalLM(cfg).eval()
    _randomise(model, 3)
    model.save_pretrained(tmp_path / "m")
    x = _x(4).astype(np.float32)
    got: dict[int, dict[str, torch.Tensor]] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def pre(m: object, args: tuple, kw: dict, i: int = i) -> None:
            got.setdefault(i, {})["x"] = kw.get("hidden_states", args[0] if args else None)

        def post(m: object, args: tuple, out: tuple, i: int = i) -> None:
            got[i]["y"], got[i]["w"] = out[0], out[1]

        hooks += [layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True),
                  layer.self_attn.register_forward_hook(post)]
    with torch.no_grad():
        model(inputs_embeds=torch.from_numpy(x), output_attentions=True)
    for h in hooks:
        h.remove()
    assert hasattr(model.model.layers[0].self_attn, "qk_norm") and not hasattr(model.model.layers[1].self_attn, "qk_norm")
    for i in (0, 1):
        np.save(tmp_path / f"x{i}.npy", got[i]["x"][0].numpy())
        res = runner.invoke(app, ["self", str(tmp_path / f"x{i}.npy"), "--weights", str(tmp_path / "m"), "--layer",
                                  str(i), "--format", "json"])
        assert res.exit_code == 0, res.stderr
        out = json.loads(res.stdout)
        np.testing.assert_allclose(np.asarray(out["weights"]), got[i]["w"][0].numpy(), atol=1e-5)
        np.testing.assert_allclose(np.asarray(out["output"]), got[i]["y"][0].numpy(), atol=1e-5)
        names = [s["name"] for s in out["steps"]]
        assert ("q_norm" in names) == (i == 0)  # the norm on the RoPE layer only


@pytest.mark.slow
def test_check_names_heads_in_the_wrong_order_before_bitnets_sub_norm(tmp_path: Path) -> None:
    """HF's BitNet with heads 0 and 1 swapped before attn_sub_norm (a hook on the module): check names the mistake,
    its variant applying the sub-norm between the concatenated heads and W_o as the model does."""
    from transformers import BitNetConfig, BitNetForCausalLM

    cfg = BitNetConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, num_hidden_layers=1,
                       intermediate_size=16, vocab_size=32, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None)
    model = BitNetForCausalLM(cfg).eval()
    _randomise(model, 6)
    model.save_pretrained(tmp_path / "m")
    attn = model.model.layers[0].self_attn
    got: dict[str, torch.Tensor] = {}

    def swap(m: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        c = args[0].reshape(1, T, H, E // H)[:, :, [1, 0, 2, 3]]
        return (c.reshape(1, T, E),)

    def take(m: torch.nn.Module, a: tuple[torch.Tensor, ...], kw: dict[str, torch.Tensor]) -> None:
        got.setdefault("x", kw["hidden_states"])

    h1 = attn.register_forward_pre_hook(take, with_kwargs=True)
    h2 = attn.attn_sub_norm.register_forward_pre_hook(swap)
    def out(m: torch.nn.Module, a: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
        got.setdefault("y", y)

    h3 = attn.o_proj.register_forward_hook(out)
    with torch.no_grad():
        model(input_ids=torch.arange(T)[None] % 32)
    for h in (h1, h2, h3):
        h.remove()
    np.save(tmp_path / "x.npy", got["x"][0].numpy())
    np.save(tmp_path / "y.npy", got["y"][0].numpy())
    res = runner.invoke(app, ["check", str(tmp_path / "y.npy"), str(tmp_path / "x.npy"), "--weights",
                              str(tmp_path / "m"), "--layer", "0", "--format", "json"])
    assert res.exit_code == 1, res.stderr
    doc = json.loads(res.stdout)
    assert [e["name"] for e in doc["explanations"]] == ["heads-wrong-order"]
    assert "head 1, head 0, head 2, head 3" in doc["explanations"][0]["explanation"]


def test_explain_reads_the_tuned_and_clamped_rows(files: Path, tmp_path: Path) -> None:
    """--explain writes the score with the q that the score read: q_temp (Llama 4) and q_clip/k_clip (OLMo)."""
    q = np.random.default_rng(7).normal(size=(6, 4))
    np.save(tmp_path / "q.npy", q)
    res = runner.invoke(app, ["run", str(tmp_path / "q.npy"), "--causal", "--tuning-scale", "1", "--tuning-floor", "1",
                              "--explain", "3,1", "--steps", "scores"])
    assert res.exit_code == 0, res.stderr
    f = math.log(math.floor(4 / 1) + 1) + 1  # query 3: log(floor((3 + 1) / 1) + 1) · 1 + 1
    text = " ".join(res.stdout.split())
    assert "sim(q3, k1) = q_temp(q3) · k(k1)" in text
    assert all(f"{abs(a):.4f}" in text for a in q[3] * f)  # the tuned row, multiplied by hand here
    res = runner.invoke(app, ["self", str(files / "x.npy"), "--weights", str(files / "w.npz"), "--heads", "2",
                              "--clip-qkv", "0.5", "--explain", "2,1", "--steps", "scores"])
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "q_clip(q2) · k_clip(k1)" in text
    x, W = np.load(files / "x.npy"), np.load(files / "w.npz")
    qc = np.clip(x @ W["W_q"], -0.5, 0.5)[2, :4]  # head 0's features of query 2, clamped by numpy here
    assert all(f"{abs(a):.4f}" in text for a in qc)
