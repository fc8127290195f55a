"""Each score through the CLI: --format json (steps, weights, output, the weights used), the
terminal view, and --save NPZ, as a table of args -> exit code -> checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    rng = np.random.default_rng(8)
    arrays = {"q": rng.normal(size=(2, 3, 4)), "k4": rng.normal(size=(2, 5, 4)), "k2": rng.normal(size=(2, 5, 2)),
              "v": rng.normal(size=(2, 5, 3))}
    out = {}
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", a)
        out[name] = str(tmp_path / f"{name}.npy")
    return out


# (score and options, key file, the score's own steps, the weights recorded)
CASES = [
    (["--score", "dot"], "k4", [], []),
    (["--score", "scaled-dot", "--scaling", "seq"], "k4", ["scaled"], []),
    (["--score", "general"], "k2", ["k_proj"], ["W"]),
    (["--score", "bilinear", "--seed", "3"], "k2", ["k_proj"], ["W"]),
    (["--score", "additive", "--hidden", "6"], "k2", ["q_proj", "k_proj", "features"], ["W_q", "W_k", "w_v"]),
    (["--score", "bahdanau", "--activation", "relu"], "k2", ["q_proj", "k_proj", "features"], ["W_q", "W_k", "w_v"]),
    (["--score", "cosine", "--temperature", "0.2"], "k4", ["q_normalised", "k_normalised", "scaled"], []),
    (["--score", "gaussian", "--bandwidth", "0.5"], "k4", ["sq_dist"], []),
    (["--score", "location", "--activation", "identity"], "k2", ["key_scores"], ["W"]),
]


@pytest.mark.parametrize(("args", "key", "own", "params"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_each_score_as_json(files: dict[str, str], args: list[str], key: str, own: list[str], params: list[str]) -> None:
    res = runner.invoke(app, ["run", files["q"], files[key], files["v"], *args, "--valid-lens", "4,2", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    names = [s["name"] for s in doc["steps"]]
    assert set(own) <= set(names)
    assert all(names.index(n) < names.index("scores") for n in own if n != "scaled")  # intermediates come first
    assert names[-2:] == ["weights", "output"]
    w = np.array(doc["weights"])
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
    assert (w[0, :, 4:] == 0).all() and (w[1, :, 2:] == 0).all()  # valid lengths 4 and 2
    v = np.load(files["v"])
    np.testing.assert_allclose(doc["output"], w @ v, rtol=1e-12)  # output = weights · V
    assert sorted(doc.get("params", {})) == sorted(params)


def test_gaussian_json_matches_the_kernel_by_hand(files: dict[str, str]) -> None:
    res = runner.invoke(app, ["run", files["q"], files["k4"], files["v"], "--score", "gaussian", "--bandwidth", "0.5",
                              "-f", "json"])
    doc = json.loads(res.stdout)
    q, k = np.load(files["q"]), np.load(files["k4"])
    d2 = [[[sum((q[b, i, c] - k[b, j, c]) ** 2 for c in range(4)) for j in range(5)] for i in range(3)] for b in range(2)]
    scores = next(s["values"] for s in doc["steps"] if s["name"] == "scores")
    np.testing.assert_allclose(scores, -np.array(d2) / (2 * 0.25), rtol=1e-12)
    row = [-x / 0.5 for x in d2[1][2]]
    e = [math.exp(x - max(row)) for x in row]
    np.testing.assert_allclose(doc["weights"][1][2], [x / sum(e) for x in e], rtol=1e-12)


@pytest.mark.parametrize(("args", "key", "own", "params"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_each_score_terminal_view_and_npz(files: dict[str, str], tmp_path: Path, args: list[str], key: str,
                                          own: list[str], params: list[str]) -> None:
    out = tmp_path / "run.npz"
    res = runner.invoke(app, ["run", files["q"], files[key], files["v"], *args, "--save", str(out)])
    assert res.exit_code == 0, res.output
    for name in own:
        assert name in np.load(out).files
    for name in params:
        assert name in np.load(out).files and f"{name} (" in res.stdout  # shown and saved
    assert "weights = softmax" in res.stdout
