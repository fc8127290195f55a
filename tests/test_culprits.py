"""The culprit named (issue 32, item 3): a value from config.json is blamed on config.json and its key, an option's
value on that option, an overflow an option causes on the option (not the input), and no path string (a NUL byte,
an over-long name) ends in exit 70.

One table: each case builds its files, runs attncli in a child under a memory cap, and states the exit code, the
words the one-line message must name and the words it must not name."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = Path(__file__).resolve().parent.parent
MEMORY_CAP = 2 << 30  # bytes of address space for the child
E, H, D = 16, 4, 4
LONG = "a" * 5000  # longer than any file name (255 bytes) and any path (4096)


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def model(folder: Path, kv: int = 2, d: int = D, **config: Any) -> str:
    """A two-layer Llama-style checkpoint (random weights, head width ``d``), its config.json BASE updated with
    ``config``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t: dict[str, np.ndarray] = {}
    for n in range(2):
        p = f"model.layers.{n}.self_attn."
        t[p + "q_proj.weight"] = rng.normal(size=(H * d, E)).astype(np.float32)
        t[p + "k_proj.weight"] = rng.normal(size=(kv * d, E)).astype(np.float32)
        t[p + "v_proj.weight"] = rng.normal(size=(kv * d, E)).astype(np.float32)
        t[p + "o_proj.weight"] = rng.normal(size=(E, H * d)).astype(np.float32)
    safetensors_numpy.save_file(t, str(folder / "model.safetensors"))
    cfg = {"model_type": "llama", "hidden_size": E, "num_attention_heads": H, "num_key_value_heads": kv,
           "num_hidden_layers": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, **config}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder.name


def sharded(folder: Path, shard_name: str) -> str:
    """A checkpoint whose model.safetensors.index.json maps every tensor to ``shard_name``."""
    model(folder)
    names = list(safetensors_numpy.load_file(str(folder / "model.safetensors")))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        n: shard_name for n in names}}))
    (folder / "model.safetensors").unlink()
    return folder.name


def files(tmp: Path) -> None:
    r = np.random.default_rng(1)
    np.save(tmp / "x.npy", r.normal(size=(5, E)).astype(np.float32))
    np.save(tmp / "q.npy", r.normal(size=(4, 8)))
    np.save(tmp / "big.npy", np.full((3, 4), 1e200))
    np.save(tmp / "slopes.npy", np.array([1e308]))


SELF = ["self", "x.npy", "--layer", "1", "--weights"]
RUN = ["run", "q.npy", "q.npy", "q.npy"]

# name: (build(tmp) -> the arguments, exit code, words the message names, words it must not name)
CASES: dict[str, tuple[Callable[[Path], list[str]], int, list[str], list[str]]] = {
    "config rope_scaling linear without factor": (
        lambda t: [*SELF, model(t / "m", rope_scaling={"rope_type": "linear"})],
        2, ["config.json", "rope_scaling", "factor"], ["--rope-scaling"]),
    "config rope_scaling llama3 without its factors": (
        lambda t: [*SELF, model(t / "m", rope_scaling={"rope_type": "llama3", "factor": 8.0})],
        2, ["config.json", "rope_scaling", "low_freq_factor", "high_freq_factor"], ["--rope-scaling"]),
    # transformers 5 reads rope_parameters["factor"] for yarn (KeyError without it: "Missing required keys")
    "config rope_scaling yarn without factor": (
        lambda t: [*SELF, model(t / "m", rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 16})],
        2, ["config.json", "rope_scaling", "factor"], ["--rope-scaling"]),
    "config rope_parameters yarn without factor": (
        lambda t: [*SELF, model(t / "m", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0})],
        2, ["config.json", "rope_parameters", "factor"], ["--rope-scaling", "option rope_scaling"]),
    "config rope_parameters of an unknown rope_type": (
        lambda t: [*SELF, model(t / "m", rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0})],
        2, ["config.json", "rope_parameters", "longrope"], ["--rope-scaling", "option rope_scaling"]),
    "config rope_parameters llama3 with high_freq_factor below low_freq_factor": (
        lambda t: [*SELF, model(t / "m", rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                                          "high_freq_factor": 1.0, "original_max_position_embeddings": 16,
                                                          "rope_theta": 10000.0})],
        2, ["config.json", "rope_parameters", "high_freq_factor"], ["--rope-scaling", "option rope_scaling"]),
    # transformers' configs refuse None for these (StrictDataclassFieldValidationError): no model to agree with
    "config num_attention_heads null": (
        lambda t: [*SELF, model(t / "m", num_attention_heads=None)],
        2, ["config.json", "num_attention_heads", "null"], ["--heads", "no config.json"]),
    "config hidden_size null": (
        lambda t: [*SELF, model(t / "m", hidden_size=None)], 2, ["config.json", "hidden_size", "null"], ["--hidden"]),
    "config rope_scaling factor 1e-320": (
        lambda t: [*SELF, model(t / "m", rope_scaling={"rope_type": "linear", "factor": 1e-320})],
        2, ["config.json", "rope_scaling.factor"], ["--rope-scaling", "overflow"]),
    "config num_key_value_heads 3 of 4 heads": (
        lambda t: [*SELF, model(t / "m", kv=3)],
        2, ["config.json", "num_key_value_heads", "num_attention_heads"], ["--kv-heads"]),
    # an odd rotary width: blamed on the key it came from (HF: int(head_dim · partial_rotary_factor)), never on
    # rotary_dim, a key these configs do not have
    "config partial_rotary_factor 0.75 of head_dim 4 (3 features)": (
        lambda t: [*SELF, model(t / "m", partial_rotary_factor=0.75)],
        2, ["config.json", "partial_rotary_factor 0.75", "head_dim 4", "got 3"], ["rotary_dim", "--rotary-dim"]),
    "config rope_parameters partial_rotary_factor 0.75 (transformers 5)": (
        lambda t: [*SELF, model(t / "m", rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.75})],
        2, ["config.json", "rope_parameters.partial_rotary_factor 0.75", "got 3"], ["rotary_dim", "--rotary-dim"]),
    "config rotary_pct 0.75 (GPT-NeoX's name)": (
        lambda t: [*SELF, model(t / "m", rotary_pct=0.75)],
        2, ["config.json", "rotary_pct 0.75", "got 3"], ["rotary_dim", "--rotary-dim"]),
    "config rotary_dim 3": (
        lambda t: [*SELF, model(t / "m", rotary_dim=3)], 2, ["config.json", "rotary_dim", "got 3"], ["--rotary-dim"]),
    "config head_dim 3 (the whole head rotates)": (
        lambda t: [*SELF, model(t / "m", d=3, head_dim=3)],
        2, ["config.json", "head_dim", "got 3"], ["rotary_dim", "--rotary-dim", "--rope"]),
    # rope_scaling variants missing what they need: config.json and its key, not the flag
    "config rope_scaling yarn without original_max_position_embeddings": (
        lambda t: [*SELF, model(t / "m", rope_scaling={"rope_type": "yarn", "factor": 2.0})],
        2, ["config.json", "rope_scaling", "original_max_position_embeddings"], ["--rope-scaling"]),
    "config rope_scaling dynamic without max_position_embeddings": (
        lambda t: [*SELF, model(t / "m", rope_scaling={"rope_type": "dynamic", "factor": 2.0})],
        2, ["config.json", "rope_scaling", "max_position_embeddings"], ["--rope-scaling"]),
    "config rope_parameters dynamic without max_position_embeddings (transformers 5)": (
        lambda t: [*SELF, model(t / "m", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})],
        2, ["config.json", "rope_parameters", "max_position_embeddings"], ["--rope-scaling", "rope_scaling"]),
    # an option config.json gives under another name: that key, never the option's name or its flag
    "config query_pre_attn_scalar 1e-320 (a scale of 1e160 that overflows)": (
        lambda t: [*SELF, model(t / "m", model_type="gemma2", head_dim=D, query_pre_attn_scalar=1e-320,
                                attn_logit_softcapping=None)],  # (Gemma2Config's default soft-cap 50 bounds them)
        2, ["config.json", "query_pre_attn_scalar", "overflow"], ["--scale", "option scale", "x.npy"]),
    # transformers builds the mask of a sliding layer with create_sliding_window_causal_mask, which raises on a null
    # window (test below): attncli computed such a layer with no window at all before
    "config sliding_window null on a sliding layer (layer_types)": (
        lambda t: [*SELF, model(t / "m", model_type="gemma2", head_dim=D, sliding_window=None,
                                layer_types=["full_attention", "sliding_attention"])],
        2, ["config.json", "sliding_window", "null", "layer 1"], ["--window"]),
    "config sliding_window null on a sliding layer (Gemma 2's rule)": (
        lambda t: ["self", "x.npy", "--layer", "0", "--weights", model(t / "m", model_type="gemma2", head_dim=D,
                                                                         sliding_window=None)],
        2, ["config.json", "sliding_window", "null", "layer 0", "layer rule"], ["--window"]),
    "config rope_theta 1e-320": (
        lambda t: [*SELF, model(t / "m", rope_theta=1e-320)],
        2, ["config.json", "rope_theta", "larger than 1"], ["rope_base", "--rope-base"]),
    "config rope_parameters rope_theta 0.5 (transformers 5)": (
        lambda t: [*SELF, model(t / "m", rope_parameters={"rope_type": "default", "rope_theta": 0.5})],
        2, ["config.json", "rope_parameters.rope_theta", "larger than 1"], ["rope_base", "--rope-base"]),
    "--rope-scaling yarn without original_max_position_embeddings": (
        lambda t: [*RUN, "--rope", "half", "--rope-scaling", '{"rope_type": "yarn", "factor": 2}'],
        2, ["--rope-scaling", "original_max_position_embeddings"], ["config.json"]),
    "--rope-scaling factor 1e-320": (
        lambda t: [*RUN, "--rope", "half", "--rope-scaling", '{"rope_type": "linear", "factor": 1e-320}'],
        2, ["--rope-scaling", "factor"], ["q.npy", "rescale the inputs", "overflow"]),
    "--rope-scaling attention_factor 1e200 (beside a harmless --scale 2)": (
        lambda t: [*RUN, "--rope", "half", "--scale", "2", "--rope-scaling",
                   '{"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 4, "attention_factor": 1e200}'],
        2, ["--rope-scaling", "attention factor", "overflow"], ["q.npy", "rescale the inputs", "--scale"]),
    "--alibi-slopes 1e308": (
        lambda t: [*RUN, "--alibi-slopes", "slopes.npy"],
        2, ["--alibi-slopes", "overflow"], ["q.npy", "rescale the inputs"]),
    "--scale 1e308": (
        lambda t: [*RUN, "--scale", "1e308"], 2, ["--scale", "overflow"], ["q.npy", "rescale the inputs"]),
    "--temperature 1e-308": (
        lambda t: [*RUN, "--temperature", "1e-308"], 2, ["--temperature", "overflow"], ["q.npy", "rescale the inputs"]),
    "--tuning-scale 1e308 (Llama 4's factors are float32, as HF's: inf there)": (
        lambda t: [*RUN, "--tuning-scale", "1e308"], 2, ["--tuning-scale", "overflow"], ["q.npy", "rescale the inputs"]),
    "--tuning-floor 1e-320 (the position divided by it overflows)": (
        lambda t: [*RUN, "--tuning-scale", "2", "--tuning-floor", "1e-320"],
        2, ["--tuning-floor", "overflow"], ["q.npy", "rescale the inputs"]),
    "--softcap 1e39 in float32 (c itself is inf there: inf·tanh(s/inf) is nan)": (
        lambda t: ["run", "x.npy", "x.npy", "x.npy", "--softcap", "1e39"],
        2, ["--softcap", "overflow", "float32"], ["x.npy", "rescale the inputs"]),
    "--plot --vmin 1e308 (1e308 + 1 rounds to 1e308: a colour scale of no width)": (
        lambda t: [*RUN, "--plot", "p.png", "--vmin", "1e308"], 2, ["--vmin", "colour scale"], ["internal error"]),
    "--plot --vmin -1e308 --vmax 1e308 (the width overflows)": (
        lambda t: [*RUN, "--plot", "p.png", "--vmin", "-1e308", "--vmax", "1e308"],
        2, ["--vmin", "colour scale"], ["internal error"]),
    "inputs that overflow by themselves (--scale 2 only took part)": (
        lambda t: ["run", "big.npy", "big.npy", "big.npy", "--scale", "2"],
        2, ["big.npy", "overflow", "rescale the inputs"], ["--scale:"]),
    "weight_map naming a shard with a NUL byte": (
        lambda t: [*SELF, sharded(t / "m", "model-00001\x00.safetensors")],
        2, ["model.safetensors.index.json", "not a file name"], ["internal error"]),
    "weight_map naming a shard with a 5000-character name": (
        lambda t: [*SELF, sharded(t / "m", LONG + ".safetensors")],
        2, ["model.safetensors.index.json", "names shard"], ["internal error"]),
    "--weights with a 5000-character name": (
        lambda t: [*SELF, LONG], 2, ["cannot be read"], ["internal error"]),
    "--weights .safetensors with a 5000-character name": (
        lambda t: [*SELF, LONG + ".safetensors"], 2, ["cannot be read"], ["internal error"]),
    "--save into a folder with a 5000-character name": (
        lambda t: [*RUN, "--save", f"{LONG}/out.npz"], 2, ["cannot be written"], ["internal error"]),
    "--save with a 5000-character file name": (
        lambda t: [*RUN, "--save", f"{LONG}.npz"], 2, ["cannot be written"], ["internal error"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_culprit_is_named(name: str, tmp_path: Path) -> None:
    build, code, named, not_named = CASES[name]
    files(tmp_path)
    args = build(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("ATTNCLI_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "attncli", *args, "-q"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120, preexec_fn=_cap)
    assert r.returncode == code, (r.returncode, r.stderr[-400:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300 and "Traceback" not in r.stderr, r.stderr[-400:]
    assert r.stdout == ""
    line = lines[0]
    for w in named:
        assert w in line, (w, line)
    for w in not_named:
        assert w not in line, (w, line)
    assert not list(tmp_path.glob("*.npz")) and not list(tmp_path.glob(".*.tmp"))  # nothing half-written
    assert not list(tmp_path.glob("p.*"))


def test_transformers_itself_refuses_yarn_without_factor(tmp_path: Path) -> None:
    """The origin of the yarn rows above: transformers builds no model from such a config.json (it reads
    rope_parameters["factor"]), so attncli has no numbers of the model's own to agree with and must refuse."""
    transformers = pytest.importorskip("transformers")
    model(tmp_path / "m", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0}, vocab_size=8,
          intermediate_size=8, max_position_embeddings=32)
    with pytest.raises(KeyError, match="factor"):
        cfg = transformers.AutoConfig.from_pretrained(tmp_path / "m")
        transformers.AutoModelForCausalLM.from_config(cfg)


def test_transformers_itself_cannot_run_a_sliding_layer_without_its_window(tmp_path: Path) -> None:
    """The origin of the sliding_window null rows above: Gemma 2's model from such a config.json fails in its forward
    (no window for the sliding layer's mask), so there are no numbers of the model's own to agree with."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model(tmp_path / "m", model_type="gemma2", head_dim=D, sliding_window=None, vocab_size=8, intermediate_size=8,
          max_position_embeddings=32)
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "m")
    net = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with pytest.raises(Exception), torch.no_grad():  # noqa: B017,PT011 (transformers' own error, wording not pinned)
        net(input_ids=torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("key", ["num_attention_heads", "hidden_size"])
def test_transformers_itself_refuses_a_null(key: str, tmp_path: Path) -> None:
    """The origin of the null rows above: transformers' LlamaConfig refuses None for these keys."""
    transformers = pytest.importorskip("transformers")
    model(tmp_path / "m", **{key: None})
    with pytest.raises(Exception, match=key):
        transformers.AutoConfig.from_pretrained(tmp_path / "m")


def test_rope_scaling_beside_rope_parameters_is_refused_where_transformers_drops_a_value(tmp_path: Path) -> None:
    """transformers 5 reads a config.json's rope_scaling *instead of* its rope_parameters (convert_rope_params_to_dict):
    rope_parameters' rope_theta 500000 is dropped for the class default 10000. attncli refuses rather than pick one."""
    transformers = pytest.importorskip("transformers")
    files(tmp_path)
    model(tmp_path / "m", rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
          rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert transformers.AutoConfig.from_pretrained(tmp_path / "m").rope_parameters["rope_theta"] == 10000.0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "attncli", *SELF, "m", "-q"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120, preexec_fn=_cap)
    line = r.stderr.strip()
    assert r.returncode == 2 and r.stdout == "" and len(line.splitlines()) == 1 and len(line) < 300, r.stderr
    for w in ("config.json", "rope_scaling", "rope_parameters", "rope_theta"):
        assert w in line, (w, line)


def test_gpt_neox_without_a_rotary_fraction_rotates_a_quarter_as_transformers(tmp_path: Path) -> None:
    """A GPT-NeoX config.json whose rope_parameters gives no partial_rotary_factor (and no rotary_pct): transformers'
    GPTNeoXConfig rotates 0.25 of each head; attncli's output of layer 1 equals the module's own."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     vocab_size=64, max_position_embeddings=64, rotary_pct=0.5)
    torch.manual_seed(0)
    transformers.GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path / "neox")
    path = tmp_path / "neox" / "config.json"
    c = json.loads(path.read_text())
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}  # no partial_rotary_factor
    c.pop("rotary_pct", None)
    path.write_text(json.dumps(c))
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "neox", dtype=torch.float64).eval()
    assert m.config.rope_parameters["partial_rotary_factor"] == 0.25
    attn, seen = m.gpt_neox.layers[1].attention, {}
    pre = attn.register_forward_pre_hook(lambda mod, a, kw: seen.__setitem__("x", kw.get("hidden_states", a[0] if a
                                                                                       else None)), with_kwargs=True)
    post = attn.register_forward_hook(lambda mod, a, out: seen.__setitem__("y", out[0]))
    with torch.no_grad():
        m(inputs_embeds=torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    pre.remove()
    post.remove()
    np.save(tmp_path / "x.npy", seen["x"][0].numpy())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "attncli", "self", "x.npy", "--weights", "neox", "--layer", "1",
                        "--format", "json", "-q"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    out = np.asarray(json.loads(r.stdout)["output"]).reshape(7, 32)
    np.testing.assert_allclose(out, seen["y"][0].numpy(), rtol=1e-5, atol=1e-6)


PHI3_SCALINGS = [{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
                 {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0},
                 {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}]


@pytest.mark.parametrize("scaling", PHI3_SCALINGS, ids=[s["rope_type"] for s in PHI3_SCALINGS])
def test_a_phi3_rope_scaling_its_config_class_renames_or_refuses_is_refused(scaling: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    """Phi3Config renames rope_type yarn (and su) to longrope and refuses linear, dynamic and llama3: transformers
    computes no yarn for Phi-3 (before, attncli computed yarn: numbers of no model). Refused naming config.json and
    rope_scaling; the config class itself is the reference for each type."""
    transformers = pytest.importorskip("transformers")
    kw = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=2, max_position_embeddings=64)
    if scaling["rope_type"] == "yarn":  # read as longrope, which then asks for its long and short factors
        with pytest.raises(Exception, match="longrope"):
            transformers.Phi3Config(**kw, rope_scaling=dict(scaling))
    else:
        with pytest.raises(Exception, match=scaling["rope_type"]):
            transformers.Phi3Config(**kw, rope_scaling=dict(scaling))
    files(tmp_path)
    model(tmp_path / "m", model_type="phi3", rope_scaling=scaling, max_position_embeddings=64)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "attncli", *SELF, "m", "-q"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120, preexec_fn=_cap)
    line = r.stderr.strip()
    assert r.returncode == 2 and r.stdout == "" and len(line.splitlines()) == 1 and len(line) < 300, r.stderr
    for w in ("config.json", "rope_scaling", "phi3", scaling["rope_type"]):
        assert w in line, (w, line)
