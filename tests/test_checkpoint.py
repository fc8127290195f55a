"""The checkpoint reader: safetensors files (against the safetensors library's own reader),
headers that lie, sharded indexes, folders, PyTorch state dicts, nn.MultiheadAttention and
nanoGPT and TransformerLens layouts against their own modules, and the peak memory of
reading one layer of a 1 GB sharded checkpoint."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attncli.errors import InputError
from attncli.io.checkpoint import open_checkpoint
from attncli.io.layouts import load_layer

safetensors_numpy = pytest.importorskip("safetensors.numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")


def write_raw(path: Path, header: dict[str, Any], data: bytes, length: int | None = None) -> Path:
    """A safetensors file written byte by byte (8-byte little-endian header length, JSON header, data)."""
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)
    return path


def test_reads_what_safetensors_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float16),
              "c": rng.standard_normal((2, 2, 2)).astype(ml_dtypes.bfloat16), "d": np.arange(4, dtype=np.int64),
              "e": np.zeros((0, 3), np.float32)}
    f = tmp_path / "m.safetensors"
    safetensors_numpy.save_file(arrays, f)
    ref = safetensors_numpy.load_file(f)  # the library's own reader
    ck = open_checkpoint(f)
    assert set(ck.tensors) == set(ref)
    for k, v in ref.items():
        got = ck.tensor(k)
        assert got.dtype == v.dtype and got.shape == v.shape
        np.testing.assert_array_equal(got.astype(np.float64), v.astype(np.float64))
    assert not ck.tensor("a").flags.writeable  # the checkpoint's numbers are read-only


def test_float8_and_bfloat16_as_torch_writes_them(tmp_path: Path) -> None:
    """float8 (which safetensors' numpy path cannot return) and bfloat16 tensors written by safetensors.torch,
    read back with the values torch itself holds (its own float32 conversion is the reference)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    tensors = {"e4m3": x.to(torch.float8_e4m3fn), "e5m2": x.to(torch.float8_e5m2), "bf16": x.to(torch.bfloat16),
               "f32": x}
    f = tmp_path / "m.safetensors"
    save_file(tensors, str(f))
    ck = open_checkpoint(f)
    for name, t in tensors.items():
        got = ck.tensor(name)
        assert got.shape == (3, 4) and not got.flags.writeable
        np.testing.assert_array_equal(got.astype(np.float32), t.float().numpy())
    assert {ck.tensors[n].dtype for n in tensors} == {"float8_e4m3fn", "float8_e5m2", "bfloat16", "float32"}


def test_a_file_safetensors_refuses_beyond_our_checks_is_one_line(tmp_path: Path) -> None:
    """Bytes after the last tensor (a file not fully covered by its header): one line naming the file."""
    f = write_raw(tmp_path / "gap.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8)
    with pytest.raises(InputError) as e:
        open_checkpoint(f)
    assert _one_line(e).startswith(str(f))


def _one_line(e: pytest.ExceptionInfo[InputError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize("header, data, length, expect", [
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 16, 10_000,
     "declares a header of 10000 bytes but the file holds"),
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8, None,
     "tensor 'w' ends at byte 16 of the data but the file holds 8 bytes"),
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
      "v": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16, None, "tensors 'w' and 'v' overlap"),
    ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "tensor 'w' has dtype 'Q4'"),
    ({"w": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 16]}}, b"\0" * 16, None,
     r"tensor 'w' takes 16 bytes but shape \(3, 2\) F32 needs 24"),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "tensor 'w' has shape"),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, b"\0" * 8, None, "expected 0 <= begin <= end"),
    ({"w": {"dtype": "F32"}}, b"", None, "tensor 'w' has no dtype, shape and data_offsets"),
    ([1, 2], b"", None, "header that is not a JSON object"),
])
def test_headers_that_lie(tmp_path: Path, header: Any, data: bytes, length: int | None, expect: str) -> None:
    f = write_raw(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(InputError, match=expect) as e:
        open_checkpoint(f)
    assert _one_line(e).startswith(str(f))


def test_not_json_and_too_short(tmp_path: Path) -> None:
    f = tmp_path / "x.safetensors"
    f.write_bytes(b"\x05\0\0\0\0\0\0\0{{{{{")
    with pytest.raises(InputError, match="header that is not JSON"):
        open_checkpoint(f)
    f.write_bytes(b"\x05\0")
    with pytest.raises(InputError, match="too short for a safetensors header"):
        open_checkpoint(f)


def test_sharded_index_naming_a_missing_shard(tmp_path: Path) -> None:
    safetensors_numpy.save_file({"a": np.ones(2, np.float32)}, tmp_path / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"names shard 'model-00002-of-00002.safetensors' \(for 'b'\), which is missing"):
        open_checkpoint(tmp_path)
    index["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="maps tensor 'b' to 'model-00001-of-00002.safetensors', which does not hold it"):
        open_checkpoint(tmp_path)
    index["weight_map"]["b"] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="not a file name in its folder"):
        open_checkpoint(tmp_path)


def test_folder_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError, match="is a folder without weights") as e:
        open_checkpoint(tmp_path)
    _one_line(e)
    with pytest.raises(InputError, match="no such file or folder"):
        open_checkpoint(tmp_path / "nope")


def test_unknown_layout_and_unsupported_one(tmp_path: Path) -> None:
    f = tmp_path / "m.safetensors"
    safetensors_numpy.save_file({"foo.weight": np.ones((2, 2), np.float32)}, f)
    with pytest.raises(InputError, match="holds no attention layout attncli knows"):
        load_layer(f, 0)
    safetensors_numpy.save_file({"transformer.blocks.0.attn.Wqkv.weight": np.ones((6, 2), np.float32)}, f)
    with pytest.raises(InputError, match=r"holds MPT / Mosaic \(fused attn.Wqkv\) attention, which attncli recognises"):
        load_layer(f, 0)
    # DeepSeek's latent attention is read, but only config.json says its widths
    safetensors_numpy.save_file({"model.layers.0.self_attn.kv_a_proj_with_mqa.weight": np.ones((6, 2), np.float32)}, f)
    with pytest.raises(InputError, match=r"has no config.json, and mla tensor names fit families"):
        load_layer(f, 0)
    # Phi-3's fused qkv_proj is read, but its split needs the number of heads (config.json)
    safetensors_numpy.save_file({"model.layers.0.self_attn.qkv_proj.weight": np.ones((6, 2), np.float32)}, f)
    with pytest.raises(InputError, match=r"has no config.json, and phi3 tensor names fit families"):
        load_layer(f, 0)  # without config.json nothing settles its RoPE: refused
    with pytest.raises(InputError, match=r"qkv_proj.weight fuses q, k and v, so the number of heads is needed"):
        load_layer(f, 0, layout="phi3")


torch = pytest.importorskip("torch")


def test_pickle_in_a_bin_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "pytorch_model.bin"
    torch.save({"model": torch.nn.Linear(2, 2)}, f)  # a whole module: needs pickle
    with pytest.raises(InputError, match="weights_only=True") as e:
        open_checkpoint(f)
    _one_line(e)


def _mha_reference(x: np.ndarray, la: Any, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """nn.MultiheadAttention in float64, head by head (bidirectional, 1/sqrt(d))."""
    a = {k: np.asarray(v, np.float64) for k, v in la.arrays.items()}
    q, k, v = (x @ a["W_q"] + a["b_q"], x @ a["W_k"] + a["b_k"], x @ a["W_v"] + a["b_v"])  # (T, E) x (E, E)
    d = q.shape[1] // heads
    w = np.zeros((heads, len(x), len(x)))
    o = np.zeros_like(q)
    for h in range(heads):
        s = q[:, h * d:(h + 1) * d] @ k[:, h * d:(h + 1) * d].T / np.sqrt(d)
        p = np.exp(s - s.max(1, keepdims=True))
        w[h] = p / p.sum(1, keepdims=True)
        o[:, h * d:(h + 1) * d] = w[h] @ v[:, h * d:(h + 1) * d]
    return w, o @ a["W_o"] + a["b_o"]


@pytest.mark.parametrize("nest", ["", "state_dict", "model"])
def test_transformer_encoder_state_dict(tmp_path: Path, nest: str) -> None:
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0), num_layers=3,
                                enable_nested_tensor=False).eval()
    sd = enc.state_dict()
    f = tmp_path / "enc.pt"
    torch.save({nest: sd} if nest else sd, f)
    la = load_layer(f, 2, heads=4)
    assert la.layout == "mha" and la.layers == 3
    assert la.origin["W_k"] == "layers.2.self_attn.in_proj_weight[16:32]ᵀ"
    x = torch.randn(5, 16)
    with torch.no_grad():
        y, w = enc.layers[2].self_attn(x, x, x, need_weights=True, average_attn_weights=False)
    w_ref, y_ref = _mha_reference(x.double().numpy(), la, 4)
    assert np.abs(w_ref - w.double().numpy()).max() < 1e-6
    assert np.abs(y_ref - y.double().numpy()).max() < 1e-6


def test_single_multihead_module(tmp_path: Path) -> None:
    mha = torch.nn.MultiheadAttention(8, 2)
    f = tmp_path / "mha.safetensors"
    from safetensors.torch import save_file

    save_file(mha.state_dict(), f)
    la = load_layer(f, None)
    assert la.layout == "mha-module" and la.layers == 1
    np.testing.assert_array_equal(la.arrays["W_v"], mha.in_proj_weight.detach().numpy()[16:].T)


def test_one_registry_reads_a_multihead_module_as_weights_file_and_checkpoint(tmp_path: Path) -> None:
    """One nn.MultiheadAttention saved as a weights file (.pt) and as a checkpoint (.safetensors): the same entry
    of the one registry (attncli.io.layouts.LAYOUTS) recognises both, and both give PyTorch's own matrices,
    transposed (in_proj_weight = [W_q; W_k; W_v] by rows, out_proj (out, in))."""
    from safetensors.torch import save_file

    from attncli.io.files import Reader
    from attncli.io.layouts import LAYOUTS, find_layouts, projections_from

    mha = torch.nn.MultiheadAttention(8, 2)
    torch.nn.init.uniform_(mha.in_proj_bias)  # zero by default: make the slices tell
    sd = mha.state_dict()
    pt, st = tmp_path / "mha.pt", tmp_path / "mha.safetensors"
    torch.save(sd, pt)
    save_file(sd, st)
    names = list(sd)
    as_file, as_ckpt = find_layouts(names, files=True), find_layouts(names)
    assert len(as_file) == len(as_ckpt) == 1 and as_file[0].layout is as_ckpt[0].layout is LAYOUTS["mha-module"]
    proj = projections_from(Reader().read(str(pt)), str(pt))
    la = load_layer(st, None)
    w, b = mha.in_proj_weight.detach().numpy(), mha.in_proj_bias.detach().numpy()
    ref = {"W_q": w[:8].T, "W_k": w[8:16].T, "W_v": w[16:].T, "b_q": b[:8], "b_k": b[8:16], "b_v": b[16:],
           "W_o": mha.out_proj.weight.detach().numpy().T, "b_o": mha.out_proj.bias.detach().numpy()}
    for n, a in ref.items():
        np.testing.assert_array_equal(getattr(proj, n), a, err_msg=n)
        np.testing.assert_array_equal(la.arrays[n], a, err_msg=n)
    assert (proj.kind, la.layout) == ("mha", "mha-module")
    assert proj.origin["W_k"] == la.origin["W_k"] == "in_proj_weight[8:16]ᵀ"


def test_nanogpt_linear_c_attn_is_gpt2_transposed(tmp_path: Path) -> None:
    """nanoGPT stores c_attn as nn.Linear (3E, E); HF GPT-2 as Conv1D (E, 3E): the same textbook matrices."""
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=20,
                                                                 n_positions=8))
    model.save_pretrained(tmp_path / "hf")
    sd = {k: (v.T.contiguous() if k.endswith(("c_attn.weight", "c_proj.weight")) and ".attn." in k else v)
          for k, v in model.state_dict().items()}
    torch.save(sd, tmp_path / "nano.pt")
    hf, nano = load_layer(tmp_path / "hf", 1), load_layer(tmp_path / "nano.pt", 1, heads=2)
    assert (hf.layout, nano.layout) == ("gpt2", "nanogpt")
    for k in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_o"):
        np.testing.assert_array_equal(hf.arrays[k], nano.arrays[k])
    assert nano.origin["W_q"] == "transformer.h.1.attn.c_attn.weight[0:16]ᵀ"
    # the Linear layout under a config that says GPT-2 (Conv1D) is refused, never transposed silently
    (tmp_path / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(InputError, match=r"an nn.Linear \(3E, E\), but config.json says model_type gpt2"):
        load_layer(tmp_path / "nano.pt", 1)


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
def hooked_transformer(path: Path) -> tuple[Any, Any]:
    """A tiny HookedTransformer (GQA, rotary) from a config, randomised, its state dict saved to ``path``;
    the model and its activation cache on 9 tokens."""
    tl = pytest.importorskip("transformer_lens")
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4, n_key_value_heads=2,
                                     d_vocab=50, act_fn="gelu", normalization_type="LN",
                                     positional_embedding_type="rotary", rotary_dim=8, rotary_base=500, seed=0)
    with warnings.catch_warnings():  # "HookedTransformer is deprecated": 3.9 is the version that has it
        warnings.simplefilter("ignore", DeprecationWarning)
        model = tl.HookedTransformer(cfg).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.35)
    torch.save(model.state_dict(), path)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.arange(9)[None] * 5 % 50)
    return model, cache


def test_transformer_lens_hooked_transformer(tmp_path: Path) -> None:
    """A HookedTransformer (GQA, rotary) from a config: W_Q/_W_K layouts vs hook_pattern and hook_attn_out."""
    from test_layouts import MAX_ERR, pre_norm, reference

    model, cache = hooked_transformer(tmp_path / "tl.pt")
    la = load_layer(tmp_path / "tl.pt", 1)
    assert la.layout == "transformer-lens"
    f = la.facts
    assert (f.heads, f.kv_heads, f.head_dim, f.rope, f.rotary_dim, f.rope_base) == (4, 2, 8, "half", 8, 500.0)
    ln1 = model.blocks[1].ln1  # hook_normalized is before the LayerNorm's w and b (components/layer_norm.py)
    x = (cache["blocks.1.ln1.hook_normalized"][0] * ln1.w + ln1.b).double().detach().numpy()
    w, y = reference(la, x)
    err_w = np.abs(w - cache["blocks.1.attn.hook_pattern"][0].double().numpy()).max()
    err_y = np.abs(y - cache["blocks.1.hook_attn_out"][0].double().numpy()).max()
    err_x = np.abs(pre_norm(la, cache["blocks.1.hook_resid_pre"][0].double().numpy()) - x).max()
    MAX_ERR["transformer-lens"] = float(max(err_w, err_y, err_x))
    assert max(err_w, err_y, err_x) < 1e-5, (err_w, err_y, err_x)


PEAK = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from attncli.io.layouts import load_layer, inspect_checkpoint
    from attncli.io.checkpoint import open_checkpoint

    def rss():  # resident now, in bytes (file-backed mapped pages included)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def peak():  # VmHWM: this process image's high-water mark (ru_maxrss would count the forked parent's pages)
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))

    path, layer = sys.argv[1], int(sys.argv[2])
    start = peak()
    ck = open_checkpoint(path)  # headers only
    info = inspect_checkpoint(path)
    inspected = peak() - start
    before = peak()  # the interpreter's baseline: imports, headers, inspect
    la = load_layer(ck, layer)
    total = sum(float(np.sum(a, dtype=np.float64)) for a in la.arrays.values())  # touches every byte
    after = max(rss(), peak())
    layer_bytes = sum(a.nbytes for a in la.arrays.values())
    print(before, after, layer_bytes, total, info["stacks"][0]["layers"], inspected)
""")



def test_peak_memory_of_one_layer_of_a_1gb_sharded_checkpoint(tmp_path: Path) -> None:
    """32 layers of 4 float16 (2048, 2048) projections = 1 GiB in 4 shards; reading layer 17 stays under
    1.5 x its 32 MiB (+ the interpreter). The shards are sparse files of zeros, written header first."""
    E, L, shards = 2048, 32, 4
    per = 2 * E * E  # bytes of one float16 (E, E) matrix
    weight_map: dict[str, str] = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, Any] = {}
        off = 0
        for n in range(s * L // shards, (s + 1) * L // shards):
            for p in ("q", "k", "v", "o"):
                key = f"model.layers.{n}.self_attn.{p}_proj.weight"
                header[key] = {"dtype": "F16", "shape": [E, E], "data_offsets": [off, off + per]}
                weight_map[key] = name
                off += per
        h = json.dumps(header).encode()
        with open(tmp_path / name, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            f.truncate(8 + len(h) + off)  # zeros, without writing 256 MiB per shard
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 16,
                                                      "num_key_value_heads": 16, "hidden_size": E}))
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path), "17"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    before, after, layer_bytes, total, layers, inspected = out.stdout.split()
    assert int(inspected) < 4 << 20  # headers only: a few MiB at most for 128 tensors of a 1 GiB checkpoint
    assert int(layer_bytes) == 4 * per and float(total) == 0.0 and int(layers) == L
    grew = int(after) - int(before)
    print(f"peak RSS grew {grew / 2**20:.1f} MiB reading one layer of {int(layer_bytes) / 2**20:.0f} MiB "
          f"from a {L * 4 * per / 2**30:.0f} GiB checkpoint")
    assert grew < 1.5 * int(layer_bytes), f"reading one layer of {int(layer_bytes) >> 20} MiB grew RSS by {grew >> 20} MiB"


def test_inspect_command(tmp_path: Path) -> None:
    """`attncli inspect` as a table and as JSON; bad checkpoints exit 2 with one line naming file and tensor."""
    from typer.testing import CliRunner

    from attncli.cli import app

    transformers = pytest.importorskip("transformers")
    config = transformers.MistralConfig(hidden_size=16, intermediate_size=8, num_hidden_layers=3, num_attention_heads=2,
                                        num_key_value_heads=1, vocab_size=20, sliding_window=5)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    runner = CliRunner()
    res = runner.invoke(app, ["inspect", str(tmp_path / "m"), "--format", "json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    (stack,) = info["stacks"]
    assert (stack["layout"], stack["layers"], info["model_type"]) == ("llama", 3, "mistral")
    shapes = {t["name"]: t["shape"] for t in stack["layer_tensors"]}
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == [8, 16]  # one K/V head of 8
    assert stack["facts"]["window"] == 5 and "window" in stack["facts"]["from_config"]
    res = runner.invoke(app, ["inspect", str(tmp_path / "m")])
    assert res.exit_code == 0 and "model.layers.0.self_attn.q_proj.weightᵀ" in res.stdout
    bad = write_raw(tmp_path / "bad.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"")
    res = runner.invoke(app, ["inspect", str(bad)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "'w'" in lines[0]


def test_sharded_pytorch_bin_index(tmp_path: Path) -> None:
    """pytorch_model.bin.index.json (transformers 4's sharded .bin) maps names to torch.save shards."""
    torch.manual_seed(1)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), num_layers=2,
                                      enable_nested_tensor=False)
    sd = enc.state_dict()
    names = sorted(sd)
    half = {k: sd[k] for k in names if k.startswith("layers.0.")}
    rest = {k: sd[k] for k in names if k not in half}
    torch.save(half, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save(rest, tmp_path / "pytorch_model-00002-of-00002.bin")
    wm = {k: "pytorch_model-00001-of-00002.bin" if k in half else "pytorch_model-00002-of-00002.bin" for k in names}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": wm}))
    la = load_layer(tmp_path, 1, heads=2)
    np.testing.assert_array_equal(la.arrays["W_o"], enc.layers[1].self_attn.out_proj.weight.detach().numpy().T)


def test_fused_heads_need_the_config_and_width_must_agree(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPTNeoXConfig(hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                                        vocab_size=20)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    load_layer(tmp_path, 0)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    with pytest.raises(InputError, match="has no config.json, and neox tensor names fit families"):
        load_layer(tmp_path, 0)  # without config.json nothing settles rotary_pct and the base: refused
    with pytest.raises(InputError, match="interleaves q, k, v per head, so the number of heads is needed"):
        load_layer(tmp_path, 0, layout="gpt_neox")
    assert load_layer(tmp_path, 0, heads=2, layout="gpt_neox").facts.head_dim == 8
    cfg["hidden_size"] = 24
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="has 16 inputs but config.json says hidden_size = 24"):
        load_layer(tmp_path, 0)


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
_entry = st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "F16", "BF16", "I8", "X"]),
                                "shape": st.lists(st.integers(-2, 5), max_size=3),
                                "data_offsets": st.lists(st.integers(-4, 80), min_size=0, max_size=3)})


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(header=st.dictionaries(st.text(min_size=1, max_size=5), _entry, max_size=4),
                  size=st.integers(0, 80))
def test_any_header_is_read_or_refused_in_one_line(tmp_path_factory: Any, header: dict[str, Any], size: int) -> None:
    """Whatever a header claims, the reader either returns tensors that fit the file or refuses in one line."""
    f = write_raw(tmp_path_factory.mktemp("h") / "x.safetensors", header, b"\1" * size)
    try:
        ck = open_checkpoint(f)
    except InputError as e:
        assert "\n" not in str(e) and len(str(e)) < 300
        return
    for name in ck.tensors:
        a = ck.tensor(name)
        assert a.nbytes == ck.tensors[name].nbytes <= size


@pytest.mark.parametrize("model_type, words", [("deberta-v2", "disentangled attention"), ("diffllama", "two softmaxes"),
                                               ("mpt", "Wqkv")])
def test_a_known_refused_family_is_refused_by_its_config_first(tmp_path: Path, model_type: str, words: str) -> None:
    """config.json decides first (issue 20): a model_type attncli knows and does not read is refused with its own
    reason, whatever its tensors look like (here BERT-style names that the bert layout would read)."""
    rng = np.random.default_rng(0)
    arrays = {f"encoder.layer.0.attention.self.{n}.weight": rng.normal(size=(8, 8)).astype(np.float32)
              for n in ("query", "key", "value")}
    arrays["encoder.layer.0.attention.output.dense.weight"] = rng.normal(size=(8, 8)).astype(np.float32)
    from safetensors.numpy import save_file

    save_file(arrays, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "num_attention_heads": 2,
                                                      "hidden_size": 8}))
    with pytest.raises(InputError) as e:
        load_layer(tmp_path, 0)
    assert f"{model_type}:" in str(e.value) and words in str(e.value) and "config.json" in str(e.value)
