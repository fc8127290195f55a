"""Falcon, Phi, Persimmon and GPT-Neo checkpoints (issue 20) against the transformers modules that wrote them.

Each case builds a tiny model (2 layers, width 32, 4 heads) from a random config, randomises its weights so that
a dropped bias or norm weight shows, saves it with ``save_pretrained`` and runs it once (eager attention) with
hooks on one layer's attention module (its input, its per-head weights, its output projection's output) and
``output_hidden_states``. ``attncli self X.npy --weights FOLDER --layer N --format json`` must give the module's
per-head weights and output within 1e-5 (float32), from the module's input and with ``--from-residual`` from
``hidden_states[N]``. The per-head q, k, v that attncli reads are checked against the module's own split of its
fused query_key_value (FalconAttention._split_heads). Refusals are one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_random import randomise  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402
from attncli.io.layouts import inspect_checkpoint, load_layer  # noqa: E402

transformers.utils.logging.set_verbosity_error()
runner = CliRunner()
T, TOL = 9, 1e-5
SMALL = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64, max_position_embeddings=64)

# name -> (config class, its keys, the layer's attention module path, its output projection)
CASES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "falcon-new-decoder": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=2, bias=True),
                           "transformer.h.{n}.self_attention", "dense"),
    "falcon-multi-query": ("FalconConfig", dict(multi_query=True), "transformer.h.{n}.self_attention", "dense"),
    "falcon-per-head": ("FalconConfig", dict(multi_query=False, parallel_attn=False, bias=True),
                        "transformer.h.{n}.self_attention", "dense"),
    "falcon-alibi": ("FalconConfig", dict(multi_query=False, alibi=True, bias=True),
                     "transformer.h.{n}.self_attention", "dense"),
    "phi": ("PhiConfig", dict(num_key_value_heads=2, partial_rotary_factor=0.5, intermediate_size=32),
            "model.layers.{n}.self_attn", "dense"),
    "persimmon": ("PersimmonConfig", dict(qk_layernorm=False, intermediate_size=32),
                  "model.layers.{n}.self_attn", "dense"),
    # qk_layernorm: an nn.LayerNorm (weight and bias shared by the heads) of each head's q and k before the rotary
    "phi-qk-layernorm": ("PhiConfig", dict(qk_layernorm=True, partial_rotary_factor=0.5, intermediate_size=32),
                         "model.layers.{n}.self_attn", "dense"),
    "persimmon-qk-layernorm": ("PersimmonConfig", dict(qk_layernorm=True, intermediate_size=32),
                               "model.layers.{n}.self_attn", "dense"),
    "gpt_neo-local": ("GPTNeoConfig", dict(num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]],
                                           window_size=3), "transformer.h.{n}.attn.attention", "out_proj"),
    "gpt_neo-global": ("GPTNeoConfig", dict(num_heads=4, num_layers=2, attention_types=[[["local", "global"], 1]],
                                            window_size=3), "transformer.h.{n}.attn.attention", "out_proj"),
}
MODELS = {"FalconConfig": "FalconForCausalLM", "PhiConfig": "PhiForCausalLM", "PersimmonConfig": "PersimmonForCausalLM",
          "GPTNeoConfig": "GPTNeoForCausalLM"}


def _plain_mask(m: Any, args: Any, kw: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Falcon + ALiBi: the module on the plain causal mask (FalconModel folds alibi / sqrt(d) into the mask, and
    the eager module adds alibi again; its SDPA path and Falcon-RW add it once: tests/test_families._plain_mask)."""
    mask = kw["attention_mask"]
    low = torch.finfo(mask.dtype).min
    return args, dict(kw, attention_mask=torch.where(mask <= low / 2, low, 0.0).to(mask.dtype))


def build(name: str, folder: Path, layer: int = 1, **over: Any) -> tuple[Any, dict[str, np.ndarray]]:
    cls, kw, path, out = CASES[name]
    keys = dict(SMALL, **kw, **over)
    if cls == "GPTNeoConfig":
        keys.pop("num_attention_heads"), keys.pop("num_hidden_layers")
    cfg = getattr(transformers, cls)(**keys)
    torch.manual_seed(0)
    model = getattr(transformers, MODELS[cls])._from_config(cfg, attn_implementation="eager").eval()
    randomise(model)
    model.save_pretrained(folder)
    attn = model.get_submodule(path.format(n=layer))
    got: dict[str, Any] = {}

    def pre(m: Any, a: Any, k: Any) -> None:
        got.setdefault("x", a[0] if a else k["hidden_states"])

    def post(m: Any, a: Any, r: Any) -> None:
        got.setdefault("w", r[1])

    def proj(m: Any, a: Any, r: Any) -> None:
        got.setdefault("y", r)

    hs = [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post),
          attn.get_submodule(out).register_forward_hook(proj)]
    if getattr(cfg, "alibi", False):
        hs.append(attn.register_forward_pre_hook(_plain_mask, with_kwargs=True))
    ids = (torch.arange(T) * 7 + 3).remainder(60)[None] + 3
    with torch.no_grad():
        res = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for h in hs:
        h.remove()
    got["h"] = res.hidden_states[layer]
    return attn, {k: v[0].double().numpy() for k, v in got.items()}


def run_self(folder: Path, src: np.ndarray, work: Path, layer: int = 1, *flags: str) -> tuple[Any, Any]:
    path = work / "x.npy"
    np.save(path, src.astype(np.float32))
    res = runner.invoke(app, ["self", str(path), "--weights", str(folder), "--layer", str(layer), "--format", "json",
                              *flags])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    return np.array(doc["weights"]), np.array(doc["output"])


def refused(args: list[str]) -> str:
    res = runner.invoke(app, args)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.stderr)
    return lines[0]


@pytest.mark.parametrize("name", list(CASES))
def test_layer_matches_the_module(name: str, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    _, ref = build(name, folder)
    for src, flags in ((ref["x"], ()), (ref["h"], ("--from-residual",))):
        w, y = run_self(folder, src, tmp_path, 1, *flags)
        assert w.shape == ref["w"].shape and y.shape == ref["y"].shape
        assert np.abs(w - ref["w"]).max() < TOL, (name, flags)
        assert np.abs(y - ref["y"]).max() < TOL * max(1.0, np.abs(ref["y"]).max()), (name, flags)


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("falcon")])
def test_falcon_heads_are_the_modules_split(name: str, tmp_path: Path) -> None:
    """q, k, v per head as FalconAttention._split_heads cuts its query_key_value output (k, v of each group
    broadcast to its query heads in the new decoder architecture, one k, v head in multi-query)."""
    attn, ref = build(name, tmp_path / "m")
    la = load_layer(tmp_path / "m", 1)
    x = torch.tensor(ref["x"][None], dtype=torch.float32)
    with torch.no_grad():
        q, k, v = (t[0].double().numpy() for t in attn._split_heads(attn.query_key_value(x)))  # (T, heads, d)
    f, a = la.facts, {n: np.asarray(t, np.float64) for n, t in la.arrays.items()}
    H, G, d = f.heads, f.kv_heads, f.head_dim
    assert (H, d) == (4, 8) and q.shape == (T, H, d)
    for t, ref_heads, n in (("q", q, H), ("k", k, G), ("v", v, G)):
        ours = (ref["x"] @ a["W_" + t] + a.get("b_" + t, 0.0)).reshape(T, n, d)
        if ref_heads.shape[1] != n:  # new decoder: each group's k, v repeated for its H/G query heads
            ref_heads = ref_heads[:, :: H // n]
        assert np.abs(ours - ref_heads).max() < 1e-5, t


def test_falcon_alibi_is_the_absolute_bf16_form(tmp_path: Path) -> None:
    """Falcon's ALiBi is read as the form its code computes (bf16(bf16(slope)·bf16(j)) before the 1/sqrt(d): form
    absolute-bf16, scaled;
    tests/test_alibi_forms.py checks it bit for bit against build_alibi_tensor), with no slopes of its own and no
    length limit: 600 tokens run (attncli refused inputs beyond 257 keys before)."""
    folder = tmp_path / "m"
    build("falcon-alibi", folder)
    la = load_layer(folder, 1)
    assert la.facts.alibi is True and la.facts.alibi_form == "absolute-bf16" and la.facts.alibi_scaled is True
    assert "alibi_slopes" not in la.arrays
    np.save(tmp_path / "x.npy", np.zeros((600, 32), np.float32))
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(folder), "--layer", "1", "--format",
                              "json"])
    assert res.exit_code == 0, res.stderr
    # x = 0: q = b_q, k = b_k, the same score for every key of a head: the weights are ALiBi's alone, the causal
    # softmax of FalconModel's alibi / sqrt(d)
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    w = np.array(json.loads(res.stdout)["weights"])  # (H, T, T)
    b = (build_alibi_tensor(torch.ones(1, 600, dtype=torch.long), 4, torch.float32) / np.sqrt(8))[:, 0].double()
    s = torch.where(torch.ones(600, 600, dtype=torch.bool).tril(), b[:, None, :], -torch.inf)  # (H, T, T)
    assert np.abs(w - torch.softmax(s, -1).numpy()).max() < 1e-6
    # --alibi-form relative on the same checkpoint: Falcon in exact arithmetic, slope·(j - i) / sqrt(d)
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(folder), "--layer", "1", "--format",
                              "json", "--alibi-form", "relative"])
    assert res.exit_code == 0, res.stderr
    sl = torch.tensor([2.0 ** -(2 * (h + 1)) for h in range(4)], dtype=torch.float64)  # 4 heads: 2^-2, 2^-4, ...
    exact = sl[:, None] * torch.arange(600, dtype=torch.float64) / np.sqrt(8)  # (H, T)
    s = torch.where(torch.ones(600, 600, dtype=torch.bool).tril(), exact[:, None, :], -torch.inf)
    w = np.array(json.loads(res.stdout)["weights"])
    assert np.abs(w - torch.softmax(s, -1).numpy()).max() < 1e-6


def test_refusals_name_the_key(tmp_path: Path) -> None:
    folder = tmp_path / "mq"
    build("falcon-multi-query", folder)
    np.save(tmp_path / "x.npy", np.zeros((T, 32), np.float32))
    x = str(tmp_path / "x.npy")
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, multi_query=False)))  # rows E + 2d, but per-head needs 3E
    line = refused(["self", x, "--weights", str(folder), "--layer", "1"])
    assert "query_key_value.weight" in line and "(96, 32)" in line
    cfg_path.unlink()  # bare: Bloom and Falcon name their tensors alike
    assert "config.json" in refused(["self", x, "--weights", str(folder), "--layer", "1"])
    for cls, mt in (("PhiConfig", "phi"), ("PersimmonConfig", "persimmon")):
        f = tmp_path / mt
        getattr(transformers, MODELS[cls])(getattr(transformers, cls)(**SMALL, qk_layernorm=True,
                                                                     intermediate_size=32)).save_pretrained(f)
        cfg_path = f / "config.json"
        cfg_path.write_text(json.dumps(dict(json.loads(cfg_path.read_text()), qk_layernorm=False)))
        line = refused(["self", x, "--weights", str(f), "--layer", "1"])  # the config contradicts the tensors
        assert "qk_layernorm" in line
        cfg_path.unlink()
        line = refused(["self", x, "--weights", str(f), "--layer", "1"])
        assert "no config.json" in line, line


def test_gpt_neo_bare_and_inspect(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    build("gpt_neo-local", folder)
    report = inspect_checkpoint(folder)
    keys = report["attention_keys"]
    assert keys["attention_layers"]["status"] == keys["window_size"]["status"] == "used"
    assert report["stacks"][0]["facts"]["scale"] == 1.0
    la = load_layer(folder, 1)
    assert la.facts.window == 3 and load_layer(folder, 0).facts.window is None
    (folder / "config.json").unlink()
    np.save(tmp_path / "x.npy", np.zeros((T, 32), np.float32))
    assert "config.json" in refused(["self", str(tmp_path / "x.npy"), "--weights", str(folder), "--layer", "1"])


def test_falcon_inspect_lists_its_keys(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    build("falcon-new-decoder", folder)
    keys = inspect_checkpoint(folder)["attention_keys"]
    for k in ("new_decoder_architecture", "multi_query", "alibi", "num_kv_heads", "parallel_attn", "bias"):
        assert keys[k]["status"] == "used", k


def test_persimmon_dense_is_not_phi(tmp_path: Path) -> None:
    """Persimmon's self_attn.dense matches Phi's marker; without Phi's q_proj it is not a Phi stack."""
    folder = tmp_path / "m"
    build("persimmon", folder)
    assert [s["layout"] for s in inspect_checkpoint(folder)["stacks"]] == ["persimmon"]
    assert load_layer(folder, 1).layout == "persimmon"
