"""config.json as an attacker (or a careless script) writes it (issue 22's config part, issue 20's
"known or refused"): every value attncli computes with is checked by type and range, the file is read
bounded and only when it is a regular file, and a model_type or an attention key attncli does not
declare is refused. Each case: exit 2, one line on stderr naming config.json (or the option) and the
key, nothing on stdout; never exit 0, never 70, never a hang.

The reference for "accepted" is the same checkpoint with the original config.json: a value that
passes must give the very numbers of a value the model itself was built with.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attncli.cli import app

safetensors_numpy = pytest.importorskip("safetensors.numpy")

E, H, KV, D = 16, 4, 2, 4
runner = CliRunner()


def _model(folder: Path, config: dict[str, Any] | str | bytes) -> Path:
    """A two-layer Llama-style checkpoint (random weights) with ``config`` as its config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t: dict[str, np.ndarray] = {}
    for n in range(2):
        p = f"model.layers.{n}."
        t[p + "self_attn.q_proj.weight"] = rng.normal(size=(H * D, E)).astype(np.float32)
        t[p + "self_attn.k_proj.weight"] = rng.normal(size=(KV * D, E)).astype(np.float32)
        t[p + "self_attn.v_proj.weight"] = rng.normal(size=(KV * D, E)).astype(np.float32)
        t[p + "self_attn.o_proj.weight"] = rng.normal(size=(E, H * D)).astype(np.float32)
        t[p + "input_layernorm.weight"] = (1 + 0.3 * rng.normal(size=E)).astype(np.float32)
    safetensors_numpy.save_file(t, str(folder / "model.safetensors"))
    if isinstance(config, dict):
        config = json.dumps(config)
    if isinstance(config, str):
        config = config.encode()
    (folder / "config.json").write_bytes(config)
    return folder


BASE: dict[str, Any] = {"model_type": "llama", "hidden_size": E, "num_attention_heads": H, "num_key_value_heads": KV,
                        "num_hidden_layers": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}


def _run(folder: Path, tmp: Path, *extra: str) -> Any:
    x = tmp / "x.npy"
    np.save(x, np.random.default_rng(1).normal(size=(5, E)).astype(np.float32))
    return runner.invoke(app, ["self", str(x), "--weights", str(folder), "--layer", "1", "--format", "json", *extra])


def _refused(res: Any, *words: str) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stdout[-300:], res.stderr[-300:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300, res.stderr
    assert res.stdout == ""
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# key, bad value, words the line must hold (config.json and the key are always required)
BAD_VALUES = [
    ("num_attention_heads", "four", "positive integer"),
    ("num_attention_heads", 0, "positive integer"),
    ("num_attention_heads", -4, "positive integer"),
    ("num_attention_heads", 4.0, "positive integer"),
    ("num_attention_heads", True, "positive integer"),
    ("num_attention_heads", [4], "positive integer"),
    ("num_key_value_heads", 10 ** 30, "positive integer"),
    ("head_dim", 0, "positive integer"),
    ("head_dim", "4", "positive integer"),
    ("rope_theta", 0, "finite number > 0"),
    ("rope_theta", -1.0, "finite number > 0"),
    ("rope_theta", "1e4", "finite number"),
    ("rms_norm_eps", -1e-6, "finite number"),
    ("rms_norm_eps", False, "finite number"),
    ("sliding_window", 2.5, "positive integer"),
    ("sliding_window", True, "positive integer"),
    ("sliding_window", 0, "positive integer"),
    ("partial_rotary_factor", 0, "(0, 1]"),
    ("partial_rotary_factor", 1.5, "(0, 1]"),
    ("query_pre_attn_scalar", 0, "finite number > 0"),
    ("sliding_window_pattern", 0, "positive integer"),
    ("layer_types", ["full_attention"], "one per layer"),
    ("layer_types", ["full_attention", 3], "layer kinds"),
    ("layer_types", ["full_attention", "wobbly"], "wobbly"),
    ("layer_types", "full_attention", "layer kinds"),
    ("model_type", 7, "a string"),
    ("use_sliding_window", "yes", "true or false"),
]


@pytest.mark.parametrize(("key", "value", "words"), BAD_VALUES, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_config_json_and_the_key(key: str, value: Any, words: str, tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", {**BASE, key: value})
    line = _refused(_run(folder, tmp_path), "config.json", key.split(".")[0])
    assert words in line


NESTED = [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": "4", "original_max_position_embeddings": 64}, "factor"),
    ({"rope_type": "default", "rope_theta": -5}, "rope_theta"),
    ({"rope_type": 3}, "rope_type"),
]


@pytest.mark.parametrize(("params", "key"), NESTED)
def test_rope_parameters_are_checked_inside(params: dict[str, Any], key: str, tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", {**BASE, "rope_parameters": params})
    _refused(_run(folder, tmp_path), "config.json", f"rope_parameters.{key}")


RAW = [
    ('{"model_type": "llama", "num_attention_heads": 4, "num_attention_heads": 2}', "twice"),
    ('{"model_type": "llama", "num_attention_heads": NaN}', "not valid JSON"),
    ('{"model_type": "llama", "rope_theta": Infinity}', "not valid JSON"),
    ('{"model_type": "llama", "num_attention_heads": ' + "9" * 5000 + "}", "not valid JSON"),
    ('{"model_type": "llama", "rope_theta": 1' + "0" * 5000 + ".0}", "finite number"),
    ("[1, 2, 3]", "not a JSON object"),
    ('{"model_type": "llama"', "not valid JSON"),
    (b'{"model_type": "ll\xffama"}', "not valid JSON"),
]


@pytest.mark.parametrize(("text", "words"), RAW, ids=[str(i) for i in range(len(RAW))])
def test_a_malformed_file_is_one_line(text: str | bytes, words: str, tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", text)
    _refused(_run(folder, tmp_path), "config.json", words)


def test_a_huge_config_is_refused_without_reading_it(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", json.dumps({**BASE, "pad": "x" * (2 << 20)}))
    _refused(_run(folder, tmp_path), "config.json", "larger than")


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero")
@pytest.mark.parametrize("kind", ["fifo", "folder", "devzero"])
def test_a_config_that_is_not_a_regular_file_is_one_line(kind: str, tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", BASE)
    cfg = folder / "config.json"
    cfg.unlink()
    if kind == "fifo":
        os.mkfifo(cfg)  # opening it for reading would block for ever
    elif kind == "folder":
        cfg.mkdir()
    else:
        cfg.symlink_to("/dev/zero")
    _refused(_run(folder, tmp_path), "config.json", "expected a model config")


def test_unknown_model_type_is_refused_and_layout_forces_it(tmp_path: Path) -> None:
    """An undeclared model_type with Llama names: refused, naming the type and --layout; forced, it gives the
    same numbers as the checkpoint declared llama (the user took the risk)."""
    folder = _model(tmp_path / "m", {**BASE, "model_type": "my_llama\x1b[31m"})
    line = _refused(_run(folder, tmp_path), "config.json", "my_llama", "--layout llama")
    assert "\x1b" not in line  # the file's text is escaped for the terminal
    forced = _run(folder, tmp_path, "--layout", "llama")
    assert forced.exit_code == 0, forced.stderr
    plain = _run(_model(tmp_path / "l", BASE), tmp_path)
    assert plain.exit_code == 0, plain.stderr
    np.testing.assert_array_equal(np.array(json.loads(forced.stdout)["output"]),
                                  np.array(json.loads(plain.stdout)["output"]))
    _refused(_run(folder, tmp_path, "--layout", "nosuch"), "--layout", "nosuch")


@pytest.mark.parametrize(("key", "value"), [("attention_multiplier", 0.3), ("clip_qkv", 8.0),
                                            ("attention_chunk_size", 8), ("attn_logit_softcapping", 30.0),
                                            ("no_rope_layers", [1, 0])])
def test_an_attention_key_the_family_does_not_read_is_refused(key: str, value: Any, tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", {**BASE, key: value})
    _refused(_run(folder, tmp_path), "llama", key, "not supported")


def test_neutral_values_of_undeclared_keys_are_accepted(tmp_path: Path) -> None:
    """clip_qkv null, attention_chunk_size null, no_rope_layers all 1: the same numbers as without them."""
    plain = _run(_model(tmp_path / "a", BASE), tmp_path)
    same = _run(_model(tmp_path / "b", {**BASE, "clip_qkv": None, "attention_chunk_size": None,
                                        "no_rope_layers": [1, 1], "qk_layernorm": False}), tmp_path)
    assert plain.exit_code == 0 and same.exit_code == 0, (plain.stderr, same.stderr)
    for k in ("weights", "output"):
        np.testing.assert_array_equal(np.array(json.loads(plain.stdout)[k]), np.array(json.loads(same.stdout)[k]))


# hypothesis: any value of a checked key is either accepted (exit 0) or one line naming config.json and the key
VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 40), max_value=10 ** 40),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                   st.lists(st.integers(-2, 3), max_size=3), st.just({}))
KEYS = ["num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "hidden_size",
        "max_position_embeddings", "partial_rotary_factor", "rope_scaling", "layer_types", "sliding_window"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_any_value_is_accepted_or_one_line(key: str, value: Any, tmp_path: Path) -> None:
    folder = _model(tmp_path / "h", {**BASE, key: value})
    res = _run(folder, tmp_path)
    assert res.exit_code in (0, 2), (key, value, res.exit_code, res.stderr[-400:])
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and len(lines[0]) < 300, res.stderr
    else:  # accepted: heads and widths as the weights need them, the numbers finite
        out = np.array(json.loads(res.stdout)["output"])
        assert np.isfinite(out).all()
