"""The BART-style, DistilBERT and ALBERT layouts (issue 20) against the transformers modules that wrote them.

Each case builds a tiny model from a random config (no downloads), randomises its parameters so that a dropped
bias or norm weight shows, saves it with ``save_pretrained`` and runs it once (eager attention) with hooks on the
attention module (its input, its per-head weights, its output projection's output) and ``output_hidden_states``.
Then ``attncli self X.npy --weights FOLDER --layer N --format json`` runs on the module's input, and with
``--from-residual`` on ``hidden_states[N]``; its per-head weights and output must match the module's within 1e-5.
The arrays attncli reads are also compared with the module's own parameters (W_q = q_proj.weightᵀ, ...).
Refusals are one line on stderr with exit 2, naming the file, key or option.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.errors import InputError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_random import randomise  # noqa: E402

from attncli.io.layouts import inspect_checkpoint, load_layer  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
runner = CliRunner()
T, E, H, TOL = 7, 32, 4, 1e-5


def _module(model: Any, path: str) -> Any:
    m = model
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)
    return m


def _capture(model: Any, attn: Any, out: Any, ids: Any, **kw: Any) -> tuple[list[dict[str, Any]], Any]:
    """Every call of ``attn``: its input x, its weights, its output projection's output y; and the hidden states."""
    calls: list[dict[str, Any]] = []

    def pre(m: Any, a: Any, kw: Any) -> None:
        calls.append({"x": a[0] if a else kw["hidden_states"]})

    def post(m: Any, a: Any, r: Any) -> None:
        calls[-1].setdefault("weights", r[1])

    def proj(m: Any, a: Any, r: Any) -> None:
        calls[-1].setdefault("y", r)

    hs = [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post),
          out.register_forward_hook(proj)]
    try:
        with torch.no_grad():
            res = model(input_ids=ids, output_attentions=True, output_hidden_states=True, use_cache=False, **kw)
    finally:
        for h in hs:
            h.remove()
    hidden = res.decoder_hidden_states if "decoder_input_ids" in kw else res.hidden_states
    return [{k: v[0].double().numpy() for k, v in c.items()} for c in calls], hidden


def build(model_type: str, folder: Path, attn: str, out: str, masked: bool = False, **cfg: Any) -> Any:
    """A tiny model of ``model_type`` saved in ``folder``; returns (model, calls, hidden) of the module at ``attn``."""
    config = transformers.AutoConfig.for_model(model_type, vocab_size=50, max_position_embeddings=32, **cfg)
    for k in ("dropout", "attention_dropout", "activation_dropout", "attention_probs_dropout_prob",
              "hidden_dropout_prob"):
        if isinstance(getattr(config, k, None), float):
            setattr(config, k, 0.0)
    auto = transformers.AutoModelForMaskedLM if masked else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    model = auto.from_config(config, attn_implementation="eager").eval()
    randomise(model)
    model.save_pretrained(folder)
    module = _module(model, attn)
    ids = (torch.arange(T) * 7 + 3).remainder(45)[None] + 4
    calls, hidden = _capture(model, module, _module(module, out), ids)
    return model, calls, hidden


def self_json(folder: Path, x: np.ndarray, layer: int, *extra: str) -> dict[str, Any]:
    path = folder.parent / "x.npy"
    np.save(path, x.astype(np.float32))
    res = runner.invoke(app, ["self", str(path), "--weights", str(folder), "--layer", str(layer), "--format", "json",
                              *extra])
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def agree(folder: Path, call: dict[str, Any], hidden: np.ndarray, layer: int) -> None:
    """attncli's weights and output, from the module's input and from hidden_states[layer], are the module's."""
    for x, extra in ((call["x"], ()), (hidden, ("--from-residual",))):
        doc = self_json(folder, x, layer, *extra)
        w, y = np.array(doc["weights"]), np.array(doc["output"])
        assert w.shape == call["weights"].shape
        np.testing.assert_allclose(w, call["weights"], atol=TOL, rtol=0)
        np.testing.assert_allclose(y, call["y"], atol=TOL * max(1.0, float(np.abs(call["y"]).max())), rtol=0)


def refused(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (res.exit_code, res.stdout[-300:], res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300, res.stderr
    return lines[0]


def same_arrays(folder: Path, layer: int, module: Any, names: dict[str, str]) -> None:
    """The textbook arrays read are the module's parameters, transposed (nn.Linear (out, in) -> (in, out))."""
    la = load_layer(folder, layer)
    for ours, theirs in names.items():
        lin = getattr(module, theirs)
        np.testing.assert_array_equal(la.arrays["W_" + ours[-1]], lin.weight.detach().numpy().T)
        if lin.bias is not None:
            np.testing.assert_array_equal(la.arrays["b_" + ours[-1]], lin.bias.detach().numpy())
        else:
            assert "b_" + ours[-1] not in la.arrays


BART_NAMES = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": "out_proj"}

# model_type -> (the layer's attention module, config over the tiny one); the layer tested is 1 of 2
BART_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "opt": ("model.decoder.layers.1.self_attn", dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=2,
                                                      ffn_dim=32, word_embed_proj_dim=E)),
    "opt-post-norm": ("model.decoder.layers.1.self_attn", dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=2,
                                                                ffn_dim=32, word_embed_proj_dim=E,
                                                                do_layer_norm_before=False)),
    "opt-no-affine-no-bias": ("model.decoder.layers.1.self_attn",
                              dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=2, ffn_dim=32,
                                   word_embed_proj_dim=E, layer_norm_elementwise_affine=False, enable_bias=False)),
    "biogpt": ("biogpt.layers.1.self_attn", dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=2,
                                                 intermediate_size=32)),
    "xglm": ("model.layers.1.self_attn", dict(d_model=E, attention_heads=H, num_layers=2, ffn_dim=32)),
    "bart": ("model.decoder.layers.1.self_attn", dict(d_model=E, decoder_attention_heads=H, decoder_layers=2,
                                                      decoder_ffn_dim=32, encoder_layers=1)),
    "mbart": ("model.decoder.layers.1.self_attn", dict(d_model=E, decoder_attention_heads=H, decoder_layers=2,
                                                       decoder_ffn_dim=32, encoder_layers=1)),
    "whisper": ("model.decoder.layers.1.self_attn", dict(d_model=E, decoder_attention_heads=H, decoder_layers=2,
                                                         decoder_ffn_dim=32, encoder_layers=1, max_target_positions=32,
                                                         pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                         decoder_start_token_id=1)),
}


@pytest.mark.parametrize("case", list(BART_CASES))
def test_bart_layout_matches_the_module(case: str, tmp_path: Path) -> None:
    attn, cfg = BART_CASES[case]
    model, calls, hidden = build(case.split("-")[0], tmp_path / "m", attn, "out_proj", **cfg)
    agree(tmp_path / "m", calls[0], hidden[1][0].double().numpy(), 1)
    same_arrays(tmp_path / "m", 1, _module(model, attn), BART_NAMES)
    la = load_layer(tmp_path / "m", 1)
    assert la.facts.causal and la.facts.heads == H and la.facts.head_dim == E // H
    post = case in ("opt-post-norm", "bart")
    assert (la.facts.pre_norm is None) == post  # post-norm: nothing comes before attention


def test_opt_pre_norm_is_self_attn_layer_norm(tmp_path: Path) -> None:
    attn, cfg = BART_CASES["opt"]
    model, _, _ = build("opt", tmp_path / "m", attn, "out_proj", **cfg)
    la = load_layer(tmp_path / "m", 1)
    ln = model.model.decoder.layers[1].self_attn_layer_norm
    np.testing.assert_array_equal(la.arrays["norm_w"], ln.weight.detach().numpy())
    np.testing.assert_array_equal(la.arrays["norm_b"], ln.bias.detach().numpy())
    assert la.facts.pre_norm_eps == ln.eps
    keys = inspect_checkpoint(tmp_path / "m")["attention_keys"]
    assert keys["do_layer_norm_before"]["status"] == "used"


def test_distilbert_matches_the_module(tmp_path: Path) -> None:
    model, calls, hidden = build("distilbert", tmp_path / "m", "distilbert.transformer.layer.1.attention", "out_lin",
                                 masked=True, dim=E, n_heads=H, n_layers=2, hidden_dim=32)
    agree(tmp_path / "m", calls[0], hidden[1][0].double().numpy(), 1)
    same_arrays(tmp_path / "m", 1, model.distilbert.transformer.layer[1].attention,
                {"W_q": "q_lin", "W_k": "k_lin", "W_v": "v_lin", "W_o": "out_lin"})
    la = load_layer(tmp_path / "m", 1)
    assert not la.facts.causal and la.facts.pre_norm is None


def test_albert_each_layer_is_a_call_of_its_shared_group(tmp_path: Path) -> None:
    """4 layers, 2 groups of 2 inner layers: 8 calls (layer N = hidden_states[N]'s layer); call 5 runs group 1's
    inner layer 1 (modeling_albert.py: group int(r / (layers / groups)), r = N // inner)."""
    cfg = dict(hidden_size=E, num_attention_heads=H, num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2,
               intermediate_size=32, embedding_size=16)
    model, _, _ = build("albert", tmp_path / "m", "albert.encoder.albert_layer_groups.1.albert_layers.1.attention",
                        "dense", masked=True, **cfg)
    module = model.albert.encoder.albert_layer_groups[1].albert_layers[1].attention
    ids = (torch.arange(T) * 7 + 3).remainder(45)[None] + 4
    calls, hidden = _capture(model, module, module.dense, ids)
    assert len(calls) == 2 and len(hidden) == 9  # this module runs in calls 5 and 7
    agree(tmp_path / "m", calls[0], hidden[5][0].double().numpy(), 5)
    agree(tmp_path / "m", calls[1], hidden[7][0].double().numpy(), 7)
    names = {"W_q": "query", "W_k": "key", "W_v": "value", "W_o": "dense"}
    same_arrays(tmp_path / "m", 5, module, names)
    same_arrays(tmp_path / "m", 2, model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention, names)
    la = load_layer(tmp_path / "m", 7)
    assert la.layers == 8 and "shared by layers 5, 7" in la.origin["W_q"]
    assert la.origin["W_q"].startswith("albert.encoder.albert_layer_groups.1.albert_layers.1.attention.query.weight")
    assert "--layer" in refused(["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "m"), "--layer", "8"])
    assert inspect_checkpoint(tmp_path / "m")["stacks"][0]["layers"] == 8


def _bare(folder: Path) -> Path:
    (folder / "config.json").unlink()
    return folder


def test_bare_checkpoints_are_refused_naming_config_or_heads(tmp_path: Path) -> None:
    attn, cfg = BART_CASES["opt"]
    build("opt", tmp_path / "opt", attn, "out_proj", **cfg)
    np.save(tmp_path / "x.npy", np.zeros((T, E), np.float32))
    x = str(tmp_path / "x.npy")
    line = refused(["self", x, "--weights", str(_bare(tmp_path / "opt")), "--layer", "1"])
    assert "config.json" in line and "--layout bart" in line
    build("distilbert", tmp_path / "db", "distilbert.transformer.layer.1.attention", "out_lin", masked=True, dim=E,
          n_heads=H, n_layers=2, hidden_dim=32)
    assert "--heads" in refused(["self", x, "--weights", str(_bare(tmp_path / "db")), "--layer", "1"])
    build("albert", tmp_path / "al", "albert.encoder.albert_layer_groups.0.albert_layers.0.attention", "dense",
          masked=True, hidden_size=E, num_attention_heads=H, num_hidden_layers=2, intermediate_size=32)
    assert "config.json" in refused(["self", x, "--weights", str(_bare(tmp_path / "al")), "--layer", "1"])


def test_encoder_decoder_reads_the_decoder_and_refuses_the_rest(tmp_path: Path) -> None:
    """A whole BART (encoder and decoder): two stacks, chosen with --prefix; the decoder's self-attention is read
    (against the module, the decoder run beside the encoder); the cross-attention is refused in one line."""
    config = transformers.BartConfig(vocab_size=50, d_model=E, encoder_layers=1, decoder_layers=2,
                                     encoder_attention_heads=H, decoder_attention_heads=H, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    randomise(model)
    model.save_pretrained(tmp_path / "m")
    attn = model.decoder.layers[1].self_attn
    ids = (torch.arange(T) * 7 + 3).remainder(45)[None] + 4
    calls, hidden = _capture(model, attn, attn.out_proj, ids, decoder_input_ids=ids)
    folder, x = str(tmp_path / "m"), tmp_path / "x.npy"
    np.save(x, calls[0]["x"])
    assert "--prefix" in refused(["self", str(x), "--weights", folder, "--layer", "1"])  # two stacks
    for src, extra in ((calls[0]["x"], ()), (hidden[1][0].double().numpy(), ("--from-residual",))):  # post-norm
        doc = self_json(tmp_path / "m", src, 1, "--prefix", "decoder.layers", *extra)
        np.testing.assert_allclose(np.array(doc["weights"]), calls[0]["weights"], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.array(doc["output"]), calls[0]["y"], atol=TOL * 10, rtol=0)
    line = refused(["self", str(x), "--weights", folder, "--layer", "0", "--prefix",
                    "decoder.layers.0.encoder_attn"])
    assert "cross-attention" in line and "--prefix" in line


def _edit_config(folder: Path, **kw: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(kw)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_refusals_name_the_key(tmp_path: Path) -> None:
    attn, cfg = BART_CASES["bart"]
    build("bart", tmp_path / "m", attn, "out_proj", **cfg)
    folder = tmp_path / "m"
    _edit_config(folder, do_layer_norm_before=False)  # OPT's key: BART's declaration does not read it
    with pytest.raises(InputError, match="do_layer_norm_before"):
        load_layer(folder, 1)
    _edit_config(folder, do_layer_norm_before=None, model_type="mvp", use_prompt=True)
    with pytest.raises(InputError, match="use_prompt"):
        load_layer(folder, 1)
    _edit_config(folder, use_prompt=False, model_type="lfm2")  # BART's tensors under LFM2's name: its QK-norm missing
    with pytest.raises(InputError, match="q_layernorm"):
        load_layer(folder, 1)


def test_a_tensor_the_bart_layout_does_not_read_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    attn, cfg = BART_CASES["biogpt"]
    build("biogpt", tmp_path / "m", attn, "out_proj", **cfg)
    path = tmp_path / "m" / "model.safetensors"
    sd = load_file(path)
    sd["biogpt.layers.1.self_attn.q_layernorm.weight"] = np.ones(E // H, np.float32)  # LFM2-like QK-norm
    save_file(sd, path)
    with pytest.raises(InputError, match="q_layernorm"):
        load_layer(tmp_path / "m", 1)


ENCODERS = ["bart", "mbart", "marian", "pegasus", "blenderbot", "blenderbot-small", "plbart", "mvp", "whisper"]


@pytest.mark.parametrize("model_type", ENCODERS)
def test_encoder_self_attention_is_bidirectional(model_type: str, tmp_path: Path) -> None:
    """An encoder-decoder's encoder layer (--prefix encoder.layers): bidirectional, its own head count (Whisper:
    2 encoder heads beside 4 decoder heads), pre- or post-norm as the family; against the encoder's module."""
    kw: dict[str, Any] = dict(vocab_size=50, d_model=E, encoder_layers=2, decoder_layers=1, encoder_attention_heads=H,
                              decoder_attention_heads=H, encoder_ffn_dim=32, decoder_ffn_dim=32,
                              max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              decoder_start_token_id=1)
    if model_type == "whisper":
        kw.update(encoder_attention_heads=2, num_mel_bins=8, max_source_positions=T, max_target_positions=32)
    config = transformers.AutoConfig.for_model(model_type, **kw)
    for k in ("dropout", "attention_dropout", "activation_dropout"):
        setattr(config, k, 0.0)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    randomise(model)
    model.save_pretrained(tmp_path / "m")
    attn = model.encoder.layers[1].self_attn
    ids = (torch.arange(T) * 7 + 3).remainder(45)[None] + 4
    if model_type == "whisper":
        feats = torch.randn(1, 8, 2 * T, generator=torch.Generator().manual_seed(1))
        inputs: dict[str, Any] = dict(input_features=feats, decoder_input_ids=ids[:, :3])
    else:
        inputs = dict(input_ids=ids, decoder_input_ids=ids[:, :3])
    calls: list[dict[str, Any]] = []

    def pre(m: Any, a: Any, k: Any) -> None:
        calls.append({"x": a[0] if a else k["hidden_states"]})

    def post(m: Any, a: Any, r: Any) -> None:
        calls[-1]["weights"] = r[1]

    def proj(m: Any, a: Any, r: Any) -> None:
        calls[-1]["y"] = r

    hs = [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post),
          attn.out_proj.register_forward_hook(proj)]
    with torch.no_grad():
        res = model(**inputs, output_attentions=True, output_hidden_states=True, use_cache=False)
    for h in hs:
        h.remove()
    call = {k: v[0].double().numpy() for k, v in calls[0].items()}
    hidden = res.encoder_hidden_states[1][0].double().numpy()
    for x, extra in ((call["x"], ()), (hidden, ("--from-residual",))):
        doc = self_json(tmp_path / "m", x, 1, "--prefix", "encoder.layers", *extra)
        np.testing.assert_allclose(np.array(doc["weights"]), call["weights"], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.array(doc["output"]), call["y"],
                                   atol=TOL * max(1.0, float(np.abs(call["y"]).max())), rtol=0)
    la = load_layer(tmp_path / "m", 1, "encoder.layers")
    assert not la.facts.causal and la.facts.heads == (2 if model_type == "whisper" else H)


def test_lfm2_attention_layers_between_convolutions(tmp_path: Path) -> None:
    """LFM2 (layer_types conv, full_attention, ...): its attention layer as Llama's with out_proj and q_layernorm /
    k_layernorm (RMS per head, before half rotary), GQA, RMS operator_norm before; a conv layer is refused."""
    model, calls, hidden = build("lfm2", tmp_path / "m", "model.layers.1.self_attn", "out_proj", hidden_size=E,
                                 num_attention_heads=H, num_key_value_heads=2, num_hidden_layers=2,
                                 intermediate_size=32, full_attn_idxs=[1], rope_parameters={"rope_type": "default",
                                                                                             "rope_theta": 100.0})
    agree(tmp_path / "m", calls[0], hidden[1][0].double().numpy(), 1)
    la = load_layer(tmp_path / "m", 1)
    qn = model.model.layers[1].self_attn.q_layernorm.weight
    np.testing.assert_array_equal(la.arrays["q_norm"], qn.detach().numpy())
    assert la.facts.kv_heads == 2 and la.facts.rope == "half" and la.facts.rope_base == 100.0
    np.save(tmp_path / "x.npy", np.zeros((T, E), np.float32))
    assert "--layer" in refused(["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "m"), "--layer", "0"])
