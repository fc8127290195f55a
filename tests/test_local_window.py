"""The bidirectional local window (--local-window R: query i sees key j when |j - (P + i)| <= R) and the families
that use it (issue 20): ModernBERT, the ModernBERT decoder (a causal --window), UltraBERT. Each against an
independent reference:

- the mask: a plain float64 loop over (query, key) written here, on the explicit, blocked (whole rows, query blocks
  and key chunks) and torch SDPA paths, alone and with --causal, --window, --q-offset; and transformers' own
  masking_utils.create_bidirectional_sliding_window_mask;
- the attention: ModernBertAttention on a local layer given HF's own mask and rotary embedding (theta per layer type);
- the readers: tiny ModernBERT / ModernBERT-decoder / UltraBERT models saved with save_pretrained, each layer's own
  attention module hooked (its input, its weights, its output projection's output) and hidden_states[N], against
  ``attncli self --weights FOLDER --layer N`` plain and --from-residual;
- the CLI: the new option, and one line with exit 2 for bad values and for configs that cannot be read exactly.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core import blocked
from attncli.core.engine import attend, run
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.projections import Projections

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

runner = CliRunner()
E, H, T = 32, 4, 11


def _plain_keep(m: int, n: int, radius: int, offset: int = 0, causal: bool = False,
                window: int | None = None) -> np.ndarray:
    """keep[i, j] from the definitions, one pair at a time: |j - p| <= R (HF sliding_window_bidirectional_overlay),
    and j <= p (causal) and j > p - W (sliding_window_overlay) where asked, with the query at p = offset + i."""
    keep = np.zeros((m, n), bool)
    for i in range(m):
        p = offset + i
        for j in range(n):
            keep[i, j] = abs(j - p) <= radius and (not causal or j <= p) and (window is None or p - window < j <= p)
    return keep


def _plain_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """float64 loops: softmax over the kept keys of q_i·k_j/√d, times V; a row with no key left gives zeros."""
    m, d = q.shape
    out = np.zeros((m, v.shape[1]))
    for i in range(m):
        js = [j for j in range(k.shape[0]) if keep[i, j]]
        if not js:
            continue
        s = [float(q[i] @ k[j]) / math.sqrt(d) for j in js]
        mx = max(s)
        e = [math.exp(x - mx) for x in s]
        for j, w in zip(js, e):
            out[i] += w / sum(e) * v[j]
    return out


# ---- the mask against a plain loop ---------------------------------------------------------------------------


CASES = [  # (R, q_offset, causal, window)
    (2, 0, False, None), (0, 0, False, None), (1, 3, False, None), (4, 0, True, None), (3, 2, False, 2),
    (30, 0, False, None), (2, 12, False, None),  # R beyond every key; queries past the keys' end: rows fully masked
]


@pytest.mark.parametrize("radius,offset,causal,window", CASES)
def test_local_window_is_the_plain_loop(radius: int, offset: int, causal: bool, window: int | None) -> None:
    rng = np.random.default_rng(radius + offset)
    m, n = 9, 11
    q, k, v = rng.normal(size=(m, 6)), rng.normal(size=(n, 6)), rng.normal(size=(n, 5))
    keep = _plain_keep(m, n, radius, offset, causal, window)
    kw: dict[str, Any] = dict(local_window=radius, q_offset=offset or None, causal=causal, window=window)
    t = attend(q, k, v, **kw)
    np.testing.assert_array_equal(t.weights > 0, keep)
    np.testing.assert_allclose(t.output, _plain_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)
    mk = t.step("masked")
    assert mk.params.local == radius and f"|j - (P + i)| <= {radius}" in mk.formula
    b = attend(q, k, v, keep_weights=False, **kw)
    assert b.meta.path == "blocked"
    np.testing.assert_allclose(b.output, t.output, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("elements", [16 * 11, 1])  # query blocks of 16 rows; and key chunks of MIN_KEYS (16)
def test_local_window_in_small_blocks_is_the_plain_loop(elements: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of queries far from the first keys: the blocked path skips the keys no query of a block sees, on both
    sides (visible_keys), and still gives the plain loop's numbers."""
    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", elements)
    rng = np.random.default_rng(5)
    m = n = 53
    q, k, v = rng.normal(size=(m, 4)), rng.normal(size=(n, 4)), rng.normal(size=(n, 3))
    for radius in (0, 3, 20):
        keep = _plain_keep(m, n, radius)
        b = attend(q, k, v, local_window=radius, keep_weights=False)
        assert b.meta.path == "blocked"
        np.testing.assert_allclose(b.output, _plain_attention(q, k, v, keep), rtol=1e-12, atol=1e-12)
        lo, hi = blocked.visible_keys(b_problem(q, k, v, radius), 20, 30)
        assert (lo, hi) == (20 - radius, min(n, 30 + radius))  # keys 20 - R ..= 29 + R


def b_problem(q: np.ndarray, k: np.ndarray, v: np.ndarray, radius: int) -> Any:
    from attncli.core.problem import Problem

    return Problem.build(q, k, v, options=Options(local_window=radius))


@pytest.mark.parametrize("offset", [0, 4])
def test_local_window_on_the_sdpa_path_is_the_plain_loop(offset: int) -> None:
    """Not is_causal: the later keys within R count too (SDPA's boolean mask)."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(1, 2, 9, 4)), rng.normal(size=(1, 2, 13, 4)), rng.normal(size=(1, 2, 13, 4))
    keep = _plain_keep(9, 13, 2, offset)
    t = attend(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), local_window=2, backend="torch",
               q_offset=offset or None, keep_weights=False)
    assert t.meta.path == "sdpa"
    want = np.stack([_plain_attention(q[0, h], k[0, h], v[0, h], keep) for h in range(2)])[None]
    np.testing.assert_allclose(t.output, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("radius", [1, 3])
def test_local_window_is_hf_bidirectional_sliding_window_mask(radius: int) -> None:
    from transformers import ModernBertConfig
    from transformers.masking_utils import create_bidirectional_sliding_window_mask

    cfg = ModernBertConfig(hidden_size=E, num_attention_heads=H, num_hidden_layers=2, local_attention=2 * radius)
    cfg._attn_implementation = "eager"
    mask = create_bidirectional_sliding_window_mask(config=cfg, inputs_embeds=torch.zeros(1, T, E),
                                                    attention_mask=None)
    hf_keep = (mask[0, 0] == 0).numpy() if mask.dtype != torch.bool else mask[0, 0].numpy()
    ours = attend(np.random.default_rng(0).normal(size=(T, 4)), local_window=radius).weights > 0
    np.testing.assert_array_equal(ours, hf_keep)
    assert not np.array_equal(hf_keep, np.tril(hf_keep))  # the later keys are there: not causal


# ---- ModernBERT's attention module on a local layer ----------------------------------------------------------


def test_local_layer_is_modernbert_attention() -> None:
    from transformers import ModernBertConfig
    from transformers.masking_utils import create_bidirectional_sliding_window_mask
    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention, ModernBertRotaryEmbedding

    cfg = ModernBertConfig(hidden_size=E, num_attention_heads=H, num_hidden_layers=2, local_attention=4,
                           attention_bias=True, layer_types=["full_attention", "sliding_attention"])
    cfg._attn_implementation = "eager"
    m = ModernBertAttention(cfg, 1).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.5))
    x = np.random.default_rng(1).normal(size=(1, T, E))
    xt = torch.from_numpy(x).float()
    pe = ModernBertRotaryEmbedding(cfg)(xt, torch.arange(T)[None], "sliding_attention")
    mask = create_bidirectional_sliding_window_mask(config=cfg, inputs_embeds=xt, attention_mask=None)
    with torch.no_grad():
        y, w = m(xt, pe, mask)
    wq, bq = m.Wqkv.weight.detach().double().numpy(), m.Wqkv.bias.detach().double().numpy()
    proj = Projections(W_q=wq[:E].T, W_k=wq[E:2 * E].T, W_v=wq[2 * E:].T, W_o=m.Wo.weight.detach().double().numpy().T,
                       b_q=bq[:E], b_k=bq[E:2 * E], b_v=bq[2 * E:], b_o=m.Wo.bias.detach().double().numpy())
    theta = float(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    o = Options(rope="half", rope_base=theta, local_window=2, dtype="float32")
    t = run(Layer.build(x.astype(np.float32), projections=proj, heads=H, options=o))
    np.testing.assert_allclose(t.weights, w.numpy(), atol=1e-5)
    np.testing.assert_allclose(t.output, y.numpy(), atol=1e-5)
    assert theta == 10000.0 and (w.numpy()[0, :, 0, 3:] == 0).all() and (w.numpy()[0, :, 5, 3:8] > 0).all()


# ---- the readers against the models' own modules -------------------------------------------------------------


def _build(kind: str, folder: Path, dtype: Any = None, **over: Any) -> dict[int, dict[str, np.ndarray]]:
    """A tiny model of ``kind`` (2 layers: global 0, local 1, unless ``over`` says), random weights large enough
    that a dropped bias or norm weight shows, saved; each layer's attention input, weights, output and
    hidden_states[N]."""
    common = dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=2, intermediate_size=32, vocab_size=40,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "ultrabert":
        cfg = transformers.UltrabertConfig(**common, sliding_window=2, layer_types=["full_attention", "sliding_attention"],
                                           num_key_value_heads=2, **over)
        model = transformers.UltrabertForMaskedLM(cfg)
        attn = [lay.self_attn for lay in model.model.layers]
        outs = [a.o_proj for a in attn]
    else:
        cls, head = ((transformers.ModernBertConfig, transformers.ModernBertForMaskedLM) if kind == "modernbert" else
                     (transformers.ModernBertDecoderConfig, transformers.ModernBertDecoderForCausalLM))
        kw = dict(local_attention=4, cls_token_id=1, sep_token_id=2, norm_bias=True, attention_bias=True)
        kw.update(over)
        cfg = cls(**common, **kw)
        model = head(cfg)
        attn = [lay.attn for lay in model.model.layers]
        outs = [a.Wo for a in attn]
    cfg._attn_implementation = "eager"
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            elif p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)
        if dtype is not None:  # the reference: the same weights rounded to dtype, computed in float32
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
    (model if dtype is None else copy.deepcopy(model).to(dtype)).save_pretrained(folder)  # rotary buffers stay fp32
    got: dict[int, dict[str, Any]] = {i: {} for i in range(2)}
    hooks = []
    for i in range(2):
        def pre(m: Any, a: Any, kw: Any, g_: dict[str, Any] = got[i]) -> None:
            g_.setdefault("x", (a[0] if a else kw["hidden_states"]).detach())

        def post(m: Any, a: Any, r: Any, g_: dict[str, Any] = got[i]) -> None:
            g_.setdefault("weights", r[1].detach())

        def proj(m: Any, a: Any, r: Any, g_: dict[str, Any] = got[i]) -> None:
            g_.setdefault("y", r.detach())

        hooks += [attn[i].register_forward_pre_hook(pre, with_kwargs=True), attn[i].register_forward_hook(post),
                  outs[i].register_forward_hook(proj)]
    ids = (torch.arange(T) * 7 + 3).remainder(37)[None] + 3
    with torch.no_grad():
        res = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for h in hooks:
        h.remove()
    return {i: {**{k: v[0].double().numpy() for k, v in got[i].items()},
                "hidden": res.hidden_states[i][0].double().numpy()} for i in range(2)}


def _self(folder: Path, layer: int, x: np.ndarray, tmp: Path, *extra: str) -> Any:
    path = tmp / f"x{layer}{len(extra)}.npy"
    np.save(path, x.astype(np.float32))
    return runner.invoke(app, ["self", str(path), "--weights", str(folder), "--layer", str(layer), "--format", "json",
                               *extra])


@pytest.mark.parametrize("kind", ["modernbert", "modernbert-decoder", "ultrabert"])
def test_reader_agrees_with_the_module(kind: str, tmp_path: Path) -> None:
    """Layer 0 (global; ModernBERT's attn_norm is an Identity there) and layer 1 (local), plain and from the
    residual stream hidden_states[N]: per-head weights and the output projection's output within 1e-5."""
    ref = _build(kind, tmp_path / "m")
    for layer in (0, 1):
        r = ref[layer]
        for src, extra in ((r["x"], ()), (r["hidden"], ("--from-residual",))):
            res = _self(tmp_path / "m", layer, src, tmp_path, *extra)
            assert res.exit_code == 0, res.stderr
            doc = json.loads(res.stdout)
            np.testing.assert_allclose(np.array(doc["weights"]), r["weights"], atol=1e-5)
            np.testing.assert_allclose(np.array(doc["output"]), r["y"], atol=1e-5 * max(1.0, np.abs(r["y"]).max()))
    w1 = ref[1]["weights"]
    if kind == "modernbert-decoder":  # the causal window of sliding_window = local_attention // 2 = 2 keys
        assert (w1[:, 5, :4] == 0).all() and (w1[:, 5, 4:6] > 0).all() and (w1[:, 5, 6:] == 0).all()
    else:  # both sides: |j - i| <= 2
        assert (w1[:, 5, :3] == 0).all() and (w1[:, 5, 3:8] > 0).all() and (w1[:, 5, 8:] == 0).all()
    if kind != "ultrabert":  # the pre-norm is applied (layer 1), not on layer 0 (nn.Identity)
        assert not np.allclose(ref[1]["x"], ref[1]["hidden"]) and np.allclose(ref[0]["x"], ref[0]["hidden"])


@pytest.mark.parametrize("kind", ["modernbert", "modernbert-decoder"])
def test_bfloat16_checkpoint_agrees(kind: str, tmp_path: Path) -> None:
    ref = _build(kind, tmp_path / "m", torch.bfloat16)
    for layer in (0, 1):
        res = _self(tmp_path / "m", layer, ref[layer]["hidden"], tmp_path, "--from-residual")
        assert res.exit_code == 0, res.stderr
        doc = json.loads(res.stdout)
        np.testing.assert_allclose(np.array(doc["weights"]), ref[layer]["weights"], atol=1e-5)
        np.testing.assert_allclose(np.array(doc["output"]), ref[layer]["y"], atol=1e-5)


def test_inspect_lists_the_keys_read(tmp_path: Path) -> None:
    _build("modernbert", tmp_path / "m")
    res = runner.invoke(app, ["inspect", str(tmp_path / "m"), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    info = json.loads(res.stdout)
    keys = info["attention_keys"]
    for k in ("local_attention", "layer_types", "rope_parameters", "attention_bias", "norm_bias", "norm_eps"):
        assert keys[k]["status"] == "used", (k, keys[k])
    assert info["stacks"][0]["layout"] == "modernbert"


# ---- the CLI ------------------------------------------------------------------------------------------------


def test_cli_local_window(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), rng.normal(size=(7, 2))
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", a)
    res = runner.invoke(app, ["run", str(tmp_path / "q.npy"), str(tmp_path / "k.npy"), str(tmp_path / "v.npy"),
                              "--local-window", "1", "--format", "json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    keep = _plain_keep(7, 7, 1)
    np.testing.assert_allclose(np.array(doc["output"]), _plain_attention(q, k, v, keep), atol=1e-12)
    np.testing.assert_array_equal(np.array(doc["weights"]) > 0, keep)


@pytest.mark.parametrize("value", ["-1", "1.5", "x", str(2 ** 60)])
def test_cli_bad_local_window_is_one_line(value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed entry point (its one-line usage errors), in this process."""
    from attncli.cli import main

    np.save(tmp_path / "q.npy", np.ones((3, 2)))
    monkeypatch.setattr(sys, "argv", ["attncli", "run", str(tmp_path / "q.npy"), f"--local-window={value}"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--local-window" in lines[0] and len(lines[0]) < 300


def test_problem_file_bad_local_window_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("q: [[1, 0], [0, 1]]\noptions:\n  local_window: -2\n")
    res = runner.invoke(app, ["run", str(f)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "p.yaml" in lines[0] and "local_window" in lines[0]


def _edit_config(folder: Path, **changes: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def test_refusals_are_one_line(tmp_path: Path) -> None:
    ref = _build("modernbert", tmp_path / "m")
    x = ref[1]["x"]

    def refused(folder: Path, *extra: str) -> str:
        res = _self(folder, 1, x, tmp_path, *extra)
        assert res.exit_code == 2, res.stdout
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and len(lines[0]) < 300
        return lines[0]

    # ModernBertRotaryEmbedding rotates the whole head whatever partial_rotary_factor says: not read, refused by key
    _edit_config(tmp_path / "m", partial_rotary_factor=0.5)
    assert "partial_rotary_factor" in refused(tmp_path / "m")
    _edit_config(tmp_path / "m", partial_rotary_factor=None)
    # transformers 4's keys: local layers used global_rope_theta when local_rope_theta was absent, 5 uses 10000
    _edit_config(tmp_path / "m", rope_parameters=None, layer_types=None, global_rope_theta=160000.0)
    assert "local_rope_theta" in refused(tmp_path / "m")
    _edit_config(tmp_path / "m", local_rope_theta=10000.0, global_attn_every_n_layers=2)  # readable again: exact
    res = _self(tmp_path / "m", 1, x, tmp_path)
    assert res.exit_code == 0, res.stderr
    np.testing.assert_allclose(np.array(json.loads(res.stdout)["weights"]), ref[1]["weights"], atol=1e-5)
    _edit_config(tmp_path / "m", local_attention=4.5)
    assert "local_attention" in refused(tmp_path / "m")
    _edit_config(tmp_path / "m", local_attention=4, layer_types=["full_attention", "chunked_attention"])
    assert "chunked_attention" in refused(tmp_path / "m")
    (tmp_path / "m" / "config.json").unlink()  # no config: which layers are local is unknown
    assert "--layout modernbert" in refused(tmp_path / "m")


def test_mpt_stays_refused(tmp_path: Path) -> None:
    """MPT's attn.Wqkv (transformer.blocks.N) is not ModernBERT's: refused by its tensors and by its model_type."""
    from safetensors.numpy import save_file

    t = {f"transformer.blocks.0.attn.{n}.weight": np.ones(s, np.float32)
         for n, s in (("Wqkv", (3 * E, E)), ("out_proj", (E, E)))}
    save_file(t, str(tmp_path / "model.safetensors"))
    np.save(tmp_path / "x.npy", np.ones((3, E), np.float32))
    for cfg in (None, {"model_type": "mpt", "d_model": E, "n_heads": H}):
        if cfg is not None:
            (tmp_path / "config.json").write_text(json.dumps(cfg))
        res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path), "--layer", "0"])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
        assert "MPT" in res.stderr or "mpt" in res.stderr


# ---- check names the local window's classic mistakes ----------------------------------------------------------


@pytest.mark.parametrize("mistake", ["local-window-off-by-one", "local-window-one-short", "causal-added"])
def test_check_names_the_local_window_mistake(mistake: str, tmp_path: Path) -> None:
    """The expected output computed by torch SDPA with a boolean mask built here from the mistaken rule (a causal
    mask on top of the local window: a decoder's sliding window on an encoder's local layer)."""
    rng = np.random.default_rng(11)
    h, n, d, r = 2, 9, 8, 2
    q, k, v = rng.normal(size=(1, h, n, d)), rng.normal(size=(1, h, n, d)), rng.normal(size=(1, h, n, 3))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = {"local-window-off-by-one": np.abs(j - i) <= r + 1, "local-window-one-short": np.abs(j - i) < r,
            "causal-added": (j <= i) & (j >= i - r)}[mistake]
    expected = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                                                attn_mask=torch.from_numpy(keep)).numpy()
    for name, a in (("q", q), ("k", k), ("v", v), ("expected", expected)):
        np.save(tmp_path / f"{name}.npy", a)
    res = runner.invoke(app, ["check", "-e", str(tmp_path / "expected.npy"), *(str(tmp_path / f"{x}.npy") for x in "qkv"),
                              "--local-window", str(r), "--what", "output", "--format", "json"])
    assert res.exit_code == 1, res.output
    names = [e["name"] for e in json.loads(res.stdout)["explanations"]]
    assert names and names[0] == mistake, names


def test_ultrabert_without_layer_types_and_with_attention_windows(tmp_path: Path) -> None:
    """UltrabertConfig's own rule when config.json has no layer_types: layer i is local when (i + 1) % 3 != 0 (layer
    1 here, as built); attention_windows (the original per-layer windows) is not read: refused naming it."""
    ref = _build("ultrabert", tmp_path / "m")
    _edit_config(tmp_path / "m", layer_types=None)
    res = _self(tmp_path / "m", 1, ref[1]["x"], tmp_path)
    assert res.exit_code == 0, res.stderr
    np.testing.assert_allclose(np.array(json.loads(res.stdout)["weights"]), ref[1]["weights"], atol=1e-5)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())  # a partial factor inside rope_parameters: the
    for params in cfg["rope_parameters"].values():  # whole head still rotates (UltrabertRotaryEmbedding takes head_dim)
        params["partial_rotary_factor"] = 0.5
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    res = _self(tmp_path / "m", 1, ref[1]["x"], tmp_path)
    assert res.exit_code == 0, res.stderr
    np.testing.assert_allclose(np.array(json.loads(res.stdout)["weights"]), ref[1]["weights"], atol=1e-5)
    _edit_config(tmp_path / "m", attention_windows=[0, 2])
    res = _self(tmp_path / "m", 1, ref[1]["x"], tmp_path)
    assert res.exit_code == 2 and "attention_windows" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_decoder_config_on_an_encoder_checkpoint_is_refused(tmp_path: Path) -> None:
    """ModernBERT fuses q, k, v (attn.Wqkv), its decoder splits them: a model_type that does not fit the tensors is
    refused in one line, never read with the other family's mask."""
    ref = _build("modernbert", tmp_path / "m")
    _edit_config(tmp_path / "m", model_type="modernbert-decoder")
    res = _self(tmp_path / "m", 1, ref[1]["x"], tmp_path)
    assert res.exit_code == 2 and "Wqkv" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_decoder_window_from_local_attention_and_the_layer_rule(tmp_path: Path) -> None:
    """A ModernBERT decoder config without layer_types and sliding_window (the family's declared rule: every
    global_attn_every_n_layers-th layer global, default 3; the window local_attention // 2): layer 1 is local with
    the window the model's own module used (its weights from ModernBertDecoderForCausalLM, local_attention 4 ->
    sliding_window 2); a local_attention that halves to no key is refused naming the key."""
    ref = _build("modernbert-decoder", tmp_path / "m")
    _edit_config(tmp_path / "m", layer_types=None, sliding_window=None)
    for layer in (0, 1):
        res = _self(tmp_path / "m", layer, ref[layer]["x"], tmp_path)
        assert res.exit_code == 0, res.stderr
        np.testing.assert_allclose(np.array(json.loads(res.stdout)["weights"]), ref[layer]["weights"], atol=1e-5)
    _edit_config(tmp_path / "m", local_attention=1)
    res = _self(tmp_path / "m", 1, ref[1]["x"], tmp_path)
    assert res.exit_code == 2 and "local_attention" in res.stderr and len(res.stderr.strip().splitlines()) == 1
