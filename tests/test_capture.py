"""`attncli capture` (issue 31): the file's members against transformers' own forward, on tiny random models with
tokenizers trained here (tests/hf_tiny.py), built once per session."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import hf_tiny  # noqa: E402

from attncli.io.capture import FORMAT, read_capture  # noqa: E402

runner = CliRunner()
TEXTS = ["The cat drank the milk because it was sweet", "the dog ate the bone"]


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tiny model, built once (each with its tokenizer saved beside it)."""
    root = tmp_path_factory.mktemp("hf")
    transformers.utils.logging.set_verbosity_error()
    return {"llama": hf_tiny.llama(root / "llama"), "gpt2": hf_tiny.gpt2(root / "gpt2"), "bert": hf_tiny.bert(root / "bert"),
            "bart": hf_tiny.bart(root / "bart"), "bf16": hf_tiny.llama(root / "bf16", dtype="bfloat16"),
            "t5": hf_tiny.t5(root / "t5")}


def cli(*args: Any) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def one_line(r: Any) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300, r.stderr
    return lines[0]


def reference(folder: Path, texts: list[str], padding_side: str = "right", auto: Any = None,
              **kw: Any) -> tuple[Any, Any]:
    """transformers' own tokenizer and eager forward on ``texts``: (the encoding, the outputs)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.padding_side = padding_side
    enc = tok(texts, padding=True, return_tensors="pt")
    model = (auto or transformers.AutoModel).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**enc, **kw, output_hidden_states=True, output_attentions=True)
    return enc, out


@pytest.mark.parametrize("side", ["right", "left"])
def test_llama_members_agree_with_transformers(models: dict[str, Path], tmp_path: Path, side: str) -> None:
    out = tmp_path / "cap.npz"
    r = cli("capture", models["llama"], *TEXTS, "-o", out, "--padding-side", side)
    assert r.exit_code == 0, r.stderr
    enc, ref = reference(models["llama"], TEXTS, side)
    with np.load(out, allow_pickle=False) as z:  # numpy's own reader, without pickle, reads every member
        assert str(z["format"]) == FORMAT
        np.testing.assert_array_equal(z["input_ids"], enc["input_ids"].numpy())
        np.testing.assert_array_equal(z["attention_mask"], enc["attention_mask"].numpy())
        want = torch.stack(ref.hidden_states).numpy()
        np.testing.assert_allclose(z["hidden_states"], want, rtol=0, atol=1e-6)
        np.testing.assert_allclose(z["attentions"], torch.stack(ref.attentions).numpy(), rtol=0, atol=1e-7)
        assert z["attention_layers"].tolist() == [0, 1]
        prov = json.loads(str(z["provenance"]))
    assert prov["model_type"] == "llama" and prov["dtype"] == "float32"
    assert prov["config_sha256"] and prov["weights_sha256"] and prov["texts"] == TEXTS
    cap = read_capture(out)
    tok = transformers.AutoTokenizer.from_pretrained(models["llama"])
    assert cap.tokens[0] == tok.convert_ids_to_tokens(enc["input_ids"][0])
    assert cap.labels[0][:3] == ["<s>", "The", "cat"]
    pad = cap.stack.padding[1]
    assert pad.sum() == 4 and (pad[:4].all() if side == "left" else pad[-4:].all())


def test_gpt2_byte_level_labels(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "g.npz"
    text = "The cat drank the milk, ça"
    assert cli("capture", models["gpt2"], text, "-o", out).exit_code == 0
    cap = read_capture(out)
    enc, ref = reference(models["gpt2"], [text])
    np.testing.assert_allclose(cap.hidden_states, torch.stack(ref.hidden_states).numpy(), rtol=0, atol=1e-6)
    assert cap.tokens[0][:3] == ["The", "Ġcat", "Ġdrank"]
    assert cap.labels[0][:3] == ["The", " cat", " drank"]  # the leading space kept
    # 'ç' is two bytes, each its own token here: each label is its byte, escaped (never U+FFFD)
    assert "\\xc3" in cap.labels[0] and "\ufffd" not in "".join(cap.labels[0])


def test_bert_special_tokens(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "b.npz"
    assert cli("capture", models["bert"], TEXTS[0], "-o", out).exit_code == 0
    cap = read_capture(out)
    enc, ref = reference(models["bert"], [TEXTS[0]])
    np.testing.assert_allclose(cap.hidden_states, torch.stack(ref.hidden_states).numpy(), rtol=0, atol=1e-6)
    assert cap.labels[0][0] == "[CLS]" and cap.labels[0][-1] == "[SEP]"
    assert cap.special_tokens_mask is not None and cap.special_tokens_mask[0, [0, -1]].all()
    assert not cap.special_tokens_mask[0, 1:-1].any()


def test_bart_target(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "t.npz"
    assert cli("capture", models["bart"], "the cat drank the milk", "--target", "le chat a bu", "-o", out).exit_code == 0
    cap = read_capture(out)
    assert cap.decoder is not None and cap.cross_attentions is not None
    tok = transformers.AutoTokenizer.from_pretrained(models["bart"])
    dec_ids = cap.decoder.input_ids
    model = transformers.AutoModel.from_pretrained(models["bart"], attn_implementation="eager").eval()
    enc = tok(["the cat drank the milk"], return_tensors="pt")
    with torch.no_grad():
        ref = model(**enc, decoder_input_ids=torch.tensor(dec_ids), output_hidden_states=True, output_attentions=True)
    np.testing.assert_allclose(cap.hidden_states, torch.stack(ref.encoder_hidden_states).numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(cap.decoder.hidden_states, torch.stack(ref.decoder_hidden_states).numpy(), rtol=0,
                               atol=1e-6)
    np.testing.assert_allclose(cap.cross_attentions, torch.stack(ref.cross_attentions).numpy(), rtol=0, atol=1e-7)
    # the decoder starts from the model's decoder_start_token_id, then the target's tokens
    assert dec_ids[0, 0] == model.config.decoder_start_token_id
    assert cap.decoder.labels[0][1:5] == ["<s>", "le", "chat", "a"]


def test_generate_agrees_with_generate(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "gen.npz"
    assert cli("capture", models["llama"], "The cat drank", "--generate", "3", "-o", out).exit_code == 0
    cap = read_capture(out)
    tok = transformers.AutoTokenizer.from_pretrained(models["llama"])
    model = transformers.AutoModelForCausalLM.from_pretrained(models["llama"], attn_implementation="eager").eval()
    enc = tok(["The cat drank"], return_tensors="pt")
    with torch.no_grad():
        seq = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
        full = model(seq, output_hidden_states=True)
    np.testing.assert_array_equal(cap.input_ids, seq.numpy())
    assert cap.generated is not None and cap.generated[0].tolist() == [False] * 4 + [True] * (seq.shape[1] - 4)
    np.testing.assert_allclose(cap.hidden_states, torch.stack(full.hidden_states).numpy(), rtol=0, atol=1e-6)


def test_bfloat16_forward(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bf.npz"
    assert cli("capture", models["bf16"], TEXTS[0], "--dtype", "bfloat16", "-o", out).exit_code == 0
    cap = read_capture(out)
    assert cap.dtype == "bfloat16" and cap.hidden_states.dtype == np.float32
    model = transformers.AutoModel.from_pretrained(models["bf16"], attn_implementation="eager",
                                                   dtype=torch.bfloat16).eval()
    tok = transformers.AutoTokenizer.from_pretrained(models["bf16"])
    with torch.no_grad():
        ref = model(**tok([TEXTS[0]], return_tensors="pt"), output_hidden_states=True)
    np.testing.assert_array_equal(cap.hidden_states, torch.stack(ref.hidden_states).float().numpy())  # bf16 -> f32 exact


def test_keep_layers_and_attention_budget(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "k.npz"
    assert cli("capture", models["llama"], TEXTS[0], "--keep-layers", "1", "--max-attention-mb", "0",
               "-o", out).exit_code == 0
    cap = read_capture(out)
    assert cap.stack.state_layers == (1,) and cap.attentions is None and cap.hidden_states.shape[0] == 2
    enc, ref = reference(models["llama"], [TEXTS[0]])
    np.testing.assert_allclose(cap.stack.state(1), ref.hidden_states[1].numpy(), rtol=0, atol=1e-6)
    assert cap.provenance["attentions_left_out"] == [1]


@pytest.mark.parametrize("args, culprit", [
    (["", "-o", "x.npz"], "text 1 is empty"),
    (["a", "-o", "x.txt"], "x.txt"),
    (["a"], "--output"),
])
def test_capture_refusals(models: dict[str, Path], tmp_path: Path, monkeypatch: Any, args: list[str],
                          culprit: str) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("capture", models["llama"], *args)
    assert r.exit_code == 2 and culprit in one_line(r)
    assert not (tmp_path / "x.npz").exists()


def test_too_long_and_no_tokenizer(models: dict[str, Path], tmp_path: Path) -> None:
    r = cli("capture", models["llama"], " ".join(["cat"] * 80), "-o", tmp_path / "x.npz")
    assert r.exit_code == 2 and "64 positions" in one_line(r)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((models["llama"] / f).read_bytes())
    r = cli("capture", bare, "cat", "-o", tmp_path / "x.npz")
    assert r.exit_code == 2 and "tokenizer" in one_line(r) and str(bare) in one_line(r)
    r = cli("capture", tmp_path / "nowhere", "cat", "-o", tmp_path / "x.npz")
    assert r.exit_code == 2 and "nowhere" in one_line(r)


class _Trap:
    """Unpickling this creates a file: a capture reader that unpickles would leave it behind."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def test_object_array_refused_without_unpickling(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cap.npz"
    assert cli("capture", models["llama"], TEXTS[0], "-o", out).exit_code == 0
    with np.load(out, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    marker = tmp_path / "unpickled"
    trap = np.empty(1, dtype=object)
    trap[0] = _Trap(str(marker))
    members["labels"] = trap
    bad = tmp_path / "bad.npz"
    np.savez(bad, **members)
    assert pickle.dumps(trap)  # the trap is a real pickle
    r = cli("self", bad, "--weights", models["llama"], "--layer", "0")
    assert r.exit_code == 2 and "pickle" in one_line(r) and "bad.npz" in one_line(r)
    assert not marker.exists()


# ---- every command takes a capture; verified on the spot ---------------------------------------------------

def self_json(*args: Any) -> dict[str, Any]:
    r = cli("self", *args, "--format", "json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("name, layer, extra", [
    ("llama", 1, []), ("gpt2", 0, []), ("bert", 1, []), ("bf16", 1, ["--dtype", "bfloat16"]),
    ("bart", 1, ["--prefix", "model.encoder.layers."]),
])
def test_self_on_a_capture_equals_the_models_own_attention(models: dict[str, Path], tmp_path: Path, name: str,
                                                           layer: int, extra: list[str]) -> None:
    out = tmp_path / "c.npz"
    cap_args = [a for a in extra if a != "--prefix" and not a.startswith("model.")]
    assert cli("capture", models[name], TEXTS[0], *cap_args, "-o", out).exit_code == 0
    prefix = [a for a in extra if a == "--prefix" or a.startswith("model.")]
    d = self_json(out, "--weights", models[name], "--layer", layer, *prefix)
    ma = d["model_attention"]
    assert ma["layer"] == layer and ma["agrees"] is True and ma["max_abs_diff"] <= ma["bound"]
    # against transformers' own eager attention, independently of the capture's copy
    dtype = torch.bfloat16 if name == "bf16" else torch.float32
    model = transformers.AutoModel.from_pretrained(models[name], attn_implementation="eager", dtype=dtype).eval()
    tok = transformers.AutoTokenizer.from_pretrained(models[name])
    enc = tok([TEXTS[0]], return_tensors="pt")
    with torch.no_grad():
        ref = (model.get_encoder() if name == "bart" else model)(**enc, output_attentions=True)
    want = ref.attentions[layer].float().numpy()
    tol = 2e-2 if name == "bf16" else 1e-5  # bfloat16: the model's own rounding (the bound above judges it)
    np.testing.assert_allclose(np.asarray(d["weights"]), want, rtol=0, atol=tol)
    assert d["labels"]["queries"][:2] == (["The", " cat"] if name == "gpt2" else
                                          ["[CLS]", "The"] if name == "bert" else ["<s>", "The"])


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_agrees_per_entry(models: dict[str, Path], tmp_path: Path, side: str) -> None:
    out = tmp_path / "p.npz"
    assert cli("capture", models["llama"], *TEXTS, "--padding-side", side, "-o", out).exit_code == 0
    d = self_json(out, "--weights", models["llama"], "--layer", "1")
    assert d["model_attention"]["agrees"] is True
    enc, ref = reference(models["llama"], TEXTS, side)
    got, want = np.asarray(d["weights"]), ref.attentions[1].numpy()
    for b in range(2):
        real = enc["attention_mask"][b].numpy().astype(bool)
        np.testing.assert_allclose(got[b][:, real][:, :, real], want[b][:, real][:, :, real], rtol=0, atol=1e-5)
        assert np.all(got[b][:, real][:, :, ~real] == 0)  # padding is masked: zero weight
        assert np.all(got[b][:, ~real] == 0)  # padded queries are left out (fully masked rows)
    r = cli("self", out, "--weights", models["llama"], "--layer", "1", "--format", "json")
    assert r.stderr.strip() == ""  # no warning for each padded query's masked row
    labels = d["labels"]
    assert labels["queries"][0][:3] == ["<s>", "The", "cat"] and "[PAD]" in labels["queries"][1]  # one list per entry


def test_text_view_says_it_agrees(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "c.npz"
    assert cli("capture", models["llama"], TEXTS[0], "-o", out).exit_code == 0
    r = cli("self", out, "--weights", models["llama"], "--layer", "0")
    assert r.exit_code == 0
    first = r.stdout.splitlines()[0]
    assert first.startswith("layer 0: agrees with the model's own attention, max |Δ| ") and "4 heads × 10 × 10" in first


def test_changed_config_is_refused_naming_the_change(models: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(models["llama"], folder)
    out = tmp_path / "c.npz"
    assert cli("capture", folder, TEXTS[0], "-o", out).exit_code == 0
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg
    rope["rope_theta"] = 500000.0
    (folder / "config.json").write_text(json.dumps(cfg))
    r = cli("self", out, "--weights", folder, "--layer", "1")
    line = one_line(r)
    assert r.exit_code == 2 and "rope_theta" in line and "10000.0 -> 500000.0" in line and str(folder) in line
    r = cli("self", out, "--weights", folder, "--layer", "1", "--keep-going", "--format", "json")
    assert r.exit_code == 0 and "DIFFERS from the model's own attention" in r.stderr
    assert json.loads(r.stdout)["model_attention"]["agrees"] is False


def test_a_difference_beyond_the_bound_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    """The capture's own attention altered by 1e-3 in one cell: the recomputation no longer agrees."""
    out = tmp_path / "c.npz"
    assert cli("capture", models["llama"], TEXTS[0], "-o", out).exit_code == 0
    with np.load(out, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    members["attentions"][1, 0, 2, 5, 3] += 1e-3
    bad = tmp_path / "bad.npz"
    np.savez(bad, **members)
    r = cli("self", bad, "--weights", models["llama"], "--layer", "1")
    line = one_line(r)
    assert r.exit_code == 2 and "layer 1" in line and "1.0e-03" in line and "llama" in line
    assert cli("self", bad, "--weights", models["llama"], "--layer", "0").exit_code == 0  # layer 0 untouched


def test_check_a_capture_every_layer(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "c.npz"
    assert cli("capture", models["llama"], *TEXTS, "-o", out).exit_code == 0
    r = cli("check", out, "--weights", models["llama"], "--layer", "all", "--format", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["match"] is True and [x["layer"] for x in d["layers"]] == [0, 1]
    r = cli("check", out, "--weights", models["llama"], "--layer", "1", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["what"] == "weights"


def test_check_a_capture_every_layer_says_it_compares_weights(models: dict[str, Path], tmp_path: Path) -> None:
    """``check CAPTURE --layer all`` compares each kept layer's attention *weights* with the model's own: the table's
    title, the header and the JSON say weights (not output), and a capture that kept layer 1 only is reported as
    layer 1 (not 0). Layer 1's own attention altered by 1e-3 in one cell: that layer differs by that much."""
    out = tmp_path / "k.npz"
    assert cli("capture", models["llama"], TEXTS[0], "--keep-layers", "1", "-o", out).exit_code == 0
    assert read_capture(out).stack.attention_layers == (1,)
    r = cli("check", out, "--weights", models["llama"], "--layer", "all", "--format", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["what"] == "weights" and [x["layer"] for x in d["layers"]] == [1]
    assert [x["what"] for x in d["layers"]] == ["weights"] and d["first_diverging_layer"] is None
    text = " ".join(cli("check", out, "--weights", models["llama"], "--layer", "all").stdout.split())
    assert "Attention weights by layer, against the model's own" in text and "output" not in text
    assert "every layer's attention weights agree with the model's own (1 layers" in text

    with np.load(out, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    members["attentions"][0, 0, 2, 5, 3] += 1e-3  # the kept layer (1): head 2, query 5, key 3
    bad = tmp_path / "bad.npz"
    np.savez(bad, **members)
    r = cli("check", bad, "--weights", models["llama"], "--layer", "all", "--format", "json")
    assert r.exit_code == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["first_diverging_layer"] == 1 and d["mismatched_layers"] == [1]
    assert abs(d["layers"][0]["max_abs_error"] - 1e-3) < 1e-5
    text = " ".join(cli("check", bad, "--weights", models["llama"], "--layer", "all").stdout.split())
    assert "the first that diverges is layer 1" in text and "Layer 1, the first that diverges" in text


def test_view_layers_from_a_capture_are_verified(models: dict[str, Path], tmp_path: Path) -> None:
    from attncli.cli.options import ProblemArgs
    from attncli.cli.view import model_layers, verified
    from attncli.io.files import Reader

    out = tmp_path / "c.npz"
    assert cli("capture", models["llama"], TEXTS[0], "-o", out).exit_code == 0
    layers = model_layers([str(out)], ProblemArgs(weights=models["llama"]), Reader())
    assert [name for name, _ in layers] == ["layer 0", "layer 1"]
    said = verified(layers)
    assert said.startswith("2 layers agree with the model's own attention, max |Δ| ")


def test_text_into_self_html_holds_the_words(models: dict[str, Path], tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    r = cli("self", "--weights", models["llama"], "--layer", "1", "--text", TEXTS[0], "--html", page)
    assert r.exit_code == 0, r.stderr
    html = page.read_text()
    for word in ("drank", "milk", "sweet", "because"):
        assert word in html
    assert r.stdout.startswith("layer 1: agrees with the model's own attention")


# ---- readable tokens everywhere ---------------------------------------------------------------------------

def test_labels_keep_their_spaces_visibly(models: dict[str, Path], tmp_path: Path) -> None:
    out, page = tmp_path / "g.npz", tmp_path / "g.html"
    assert cli("capture", models["gpt2"], "The cat drank the milk", "-o", out).exit_code == 0
    r = cli("self", out, "--weights", models["gpt2"], "--layer", "1", "--html", page)
    assert r.exit_code == 0, r.stderr
    assert "␣cat" in r.stdout and "␣cat" in page.read_text()  # where a table or a page would lose the space
    d = self_json(out, "--weights", models["gpt2"], "--layer", "1")
    assert d["labels"]["queries"][:2] == ["The", " cat"]  # JSON: the tokenizer's own text


@pytest.mark.parametrize("spec, query, key", [("drank,The", 2, 0), ("␣milk,1", 4, 1), ("2,0", 2, 0),
                                               ("the,The", None, None), ("␣cat,0", None, None)])
def test_explain_by_label_or_position_and_ambiguity(models: dict[str, Path], tmp_path: Path, spec: str,
                                                    query: int | None, key: int | None) -> None:
    out = tmp_path / "d.npz"
    text = "The cat drank the milk because the cat"  # ' the' and ' cat' twice each
    assert cli("capture", models["gpt2"], text, "-o", out).exit_code == 0
    labels = read_capture(out).labels[0]
    assert labels == ["The", " cat", " drank", " the", " milk", " because", " the", " cat"]
    r = cli("self", out, "--weights", models["gpt2"], "--layer", "0", "-x", spec, "--format", "json")
    if query is not None:
        assert r.exit_code == 0, r.stderr
        cell = json.loads(r.stdout)["explanations"][0]
        assert (cell["query"], cell["key"]) == (query, key)
    else:  # named with its positions, never silently the first
        line = one_line(r)
        assert r.exit_code == 2 and "ambiguous" in line and ("3, 6" in line or "1, 7" in line)


# ---- encoder-decoder: --target, --cross --------------------------------------------------------------------

@pytest.mark.parametrize("name, prefix", [("bart", "model.decoder.layers."), ("t5", "decoder.block.")])
def test_cross_attention_agrees_with_the_model(models: dict[str, Path], tmp_path: Path, name: str, prefix: str) -> None:
    out = tmp_path / "x.npz"
    texts, target = ["the cat drank the milk", "the dog"], "le chat a bu"
    assert cli("capture", models[name], *texts, "--target", target, "-o", out).exit_code == 0
    cap = read_capture(out)
    model = transformers.AutoModel.from_pretrained(models[name], attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(models[name])
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model(**enc, decoder_input_ids=torch.tensor(cap.decoder.input_ids), output_attentions=True)
    for layer in (0, 1):  # layer 0 without --prefix: --cross reads the stack whose blocks hold a cross-attention
        stack = ("--prefix", prefix) if layer else ()
        d = self_json(out, "--weights", models[name], "--layer", layer, *stack, "--cross")
        assert d["model_attention"]["agrees"] is True
        got, want = np.asarray(d["weights"]), ref.cross_attentions[layer].numpy()
        real = enc["attention_mask"].numpy().astype(bool)
        for b in range(2):  # every decoder query over the encoder's real tokens
            np.testing.assert_allclose(got[b][:, :, real[b]], want[b][:, :, real[b]], rtol=0, atol=1e-5)
        assert d["labels"]["keys"][1][:3] == ["the", "dog", "</s>"] if name == "t5" else True
    # the decoder's own self-attention, from the same capture
    d = self_json(out, "--weights", models[name], "--layer", "1", "--prefix", prefix)
    assert d["model_attention"]["agrees"] is True
    np.testing.assert_allclose(np.asarray(d["weights"]), ref.decoder_attentions[1].numpy(), rtol=0, atol=1e-5)


def test_cross_needs_a_target_capture(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "x.npz"
    assert cli("capture", models["bart"], "the cat", "-o", out).exit_code == 0
    r = cli("self", out, "--weights", models["bart"], "--layer", "0", "--prefix", "model.decoder.layers.", "--cross")
    assert r.exit_code == 2 and "--target" in one_line(r)


# ---- the forward's options and the library -----------------------------------------------------------------

def test_device_map_auto_on_the_cpu(models: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    plain, mapped = tmp_path / "a.npz", tmp_path / "b.npz"
    assert cli("capture", models["llama"], TEXTS[0], "-o", plain).exit_code == 0
    r = cli("capture", models["llama"], TEXTS[0], "--device-map", "auto", "-o", mapped)
    assert r.exit_code == 0, r.stderr
    a, b = read_capture(plain), read_capture(mapped)
    np.testing.assert_allclose(b.hidden_states, a.hidden_states, rtol=0, atol=1e-6)
    assert b.provenance["flags"]["device_map"] == "auto"


def test_chat_template_and_text_file(models: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "chat"
    shutil.copytree(models["llama"], folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.chat_template = "{% for m in messages %}<s> the {{ m['content'] }}{% endfor %}"
    tok.save_pretrained(folder)
    out = tmp_path / "c.npz"
    assert cli("capture", folder, "cat drank", "--chat", "-o", out).exit_code == 0
    want = tok(tok.apply_chat_template([{"role": "user", "content": "cat drank"}], tokenize=False,
                                       add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    assert read_capture(out).input_ids[0].tolist() == want
    assert cli("capture", models["bert"], "cat", "--chat", "-o", out).exit_code == 2  # no template: one line
    texts = tmp_path / "texts.txt"
    texts.write_text("The cat drank the milk\n\nthe dog ate\n")
    assert cli("capture", models["llama"], "--text-file", texts, "-o", out).exit_code == 0
    assert read_capture(out).provenance["texts"] == ["The cat drank the milk", "the dog ate"]


def test_library_capture_then_layer(models: dict[str, Path]) -> None:
    """capture() in memory, as `attncli heads` and --text use it: the same states as the file."""
    from attncli.io.hf import capture

    cap = capture(models["llama"], TEXTS, padding_side="right")
    enc, ref = reference(models["llama"], TEXTS)
    np.testing.assert_allclose(cap.hidden_states, torch.stack(ref.hidden_states).numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(cap.attentions), torch.stack(ref.attentions).numpy(), rtol=0, atol=1e-7)
    assert cap.stack.model_attention(1) is not None and cap.stack.state(1).shape == (2, enc["input_ids"].shape[1], 32)


def test_view_text_every_layer(models: dict[str, Path]) -> None:
    from attncli.cli.options import ProblemArgs
    from attncli.cli.view import model_layers, verified
    from attncli.io.files import Reader

    layers = model_layers([], ProblemArgs(weights=models["llama"], text=TEXTS[0]), Reader())
    assert len(layers) == 2 and "drank" in layers[0][1].query_labels
    assert verified(layers).startswith("2 layers agree")


@pytest.mark.parametrize("change, culprit", [
    (lambda m: m.update(format=np.array("attncli-capture/9")), "format"),
    (lambda m: m.pop("hidden_states"), "'hidden_states'"),
    (lambda m: m.update(attention_mask=m["attention_mask"] * 2), "'attention_mask'"),
    (lambda m: m.update(labels=m["labels"][:, :-1]), "'labels'"),
    (lambda m: m.update(attention_layers=np.array([0, 0])), "'attention_layers'"),
    (lambda m: m.update(provenance=np.array("{not json")), "'provenance'"),
    (lambda m: m.update(hidden_states=m["hidden_states"].astype(np.int64)), "'hidden_states'"),
])
def test_a_broken_capture_is_one_line(models: dict[str, Path], tmp_path: Path, change: Any, culprit: str) -> None:
    out = tmp_path / "c.npz"
    assert cli("capture", models["llama"], TEXTS[0], "-o", out).exit_code == 0
    with np.load(out, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    change(members)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **members)
    r = cli("self", bad, "--weights", models["llama"], "--layer", "0")
    line = one_line(r)
    assert r.exit_code == 2 and "bad.npz" in line and culprit in line, line


def test_library_attend_a_capture(models: dict[str, Path], tmp_path: Path) -> None:
    import attncli
    from attncli.errors import InputError

    out = tmp_path / "c.npz"
    assert cli("capture", models["llama"], *TEXTS, "--padding-side", "left", "-o", out).exit_code == 0
    cap = read_capture(out)
    trace = attncli.load_layer(models["llama"], layer=1).attend(cap)
    assert trace.extra["model_attention"]["agrees"] is True
    enc, ref = reference(models["llama"], TEXTS, "left")
    real = enc["attention_mask"].numpy().astype(bool)
    for b in range(2):
        np.testing.assert_allclose(trace.weights[b][:, real[b]][:, :, real[b]],
                                   ref.attentions[1][b].numpy()[:, real[b]][:, :, real[b]], rtol=0, atol=1e-5)
    with np.load(out, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    members["attentions"][1] = members["attentions"][0]  # layer 1's weights replaced by layer 0's
    bad = tmp_path / "bad.npz"
    np.savez(bad, **members)
    with pytest.raises(InputError, match="layer 1: the recomputation differs"):
        attncli.load_layer(models["llama"], layer=1).attend(read_capture(bad))
    kept = attncli.load_layer(models["llama"], layer=1).attend(read_capture(bad), keep_going=True)
    assert kept.extra["model_attention"]["agrees"] is False
