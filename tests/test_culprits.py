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
        lambda t: [*SELF, model(t / "m", model_type="gemma2", head_dim=D, query_pre_attn_scalar=1e-320)],
        2, ["config.json", "query_pre_attn_scalar", "overflow"], ["--scale", "option scale", "x.npy"]),
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
