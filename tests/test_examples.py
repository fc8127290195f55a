"""The textbook examples: each file's numbers checked against an independent float64 computation
written here (numpy by hand, or the d2l / PyTorch code the notes quote), the published numbers
(d2l's printed outputs; the notes' cat/milk rows and what they really are), and the
`attncli examples` command (list, show, run).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from d2l_reference import masked_softmax as d2l_masked_softmax
from typer.testing import CliRunner

from attncli.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "attncli" / "examples"
runner = CliRunner()


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def run_json(name: str, *args: str) -> dict[str, Any]:
    r = runner.invoke(app, ["examples", "run", name, "--format", "json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def step(doc: dict[str, Any], name: str) -> np.ndarray:
    if name in ("weights", "output"):
        return np.array(doc[name], dtype=float)
    return np.array(next(s["values"] for s in doc["steps"] if s["name"] == name), dtype=float)


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)





def assert_file_expected(name: str, doc: dict[str, Any], atol: float) -> None:
    """The `expected:` numbers written in the file agree with what attncli computes."""
    for key, values in load(name)["expected"].items():
        np.testing.assert_allclose(step(doc, key), np.array(values, dtype=float), atol=atol, err_msg=f"{name}: {key}")


# ---- cat / milk (the self-attention note) -----------------------------------------------------


@pytest.mark.parametrize("name, last, published", [
    # the notes' rows, two shown dimensions: cat, milk, it, sweet|hungry
    ("cat_milk_sweet", [0, 0, 4, 0], [[0.625, 1.375], [0.089, 1.911], [0.625, 1.375], [0.010, 1.990]]),
    ("cat_milk_hungry", [0, 4, 0, 0], [[1.125, 0.875], [0.609, 1.391], [1.125, 0.875], [1.999, 0.001]]),
])
def test_cat_milk_examples(name: str, last: list[int], published: list[list[float]]) -> None:
    X = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], last], dtype=float)
    doc = run_json(name)
    ref = softmax64(X @ X.T / math.sqrt(4)) @ X  # (4, 4) x (4, 4): softmax(XXᵀ/√d) X, d = 4
    np.testing.assert_allclose(doc["output"], ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(step(doc, "scores"), X @ X.T)  # the published Q·Kᵀ tables
    assert_file_expected(name, doc, atol=5e-5)
    # the published rows are softmax(QKᵀ)·V / √d (scaling after the softmax), to their 3 decimals
    wrong = softmax64(X @ X.T) @ X / math.sqrt(4)
    np.testing.assert_allclose(wrong[:, 1:3], published, atol=5e-4)
    assert not np.allclose(ref[:, 1:3], published, atol=5e-4)


def test_cat_milk_it_moves_towards_milk_or_cat() -> None:
    # the notes: after attention, sim(it, milk) > sim(it, cat) for "sweet", the reverse for "hungry"
    sweet = run_json("cat_milk_sweet", "--similarity", "dot")["diagnostics"]["similarity"]["after"]
    hungry = run_json("cat_milk_hungry", "--similarity", "dot")["diagnostics"]["similarity"]["after"]
    assert sweet[2][1] > sweet[2][0] and hungry[2][1] < hungry[2][0]
    assert sweet[2][1] == pytest.approx(10.16765990978983, rel=1e-12)  # (1.25, 2.75)·(0.554893, 3.445107)
    assert hungry[2][0] == pytest.approx(2.25**2 + 1.75**2, rel=1e-12)  # it = cat = (2.25, 1.75)


# ---- d2l --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["d2l_masked_softmax", "d2l_masked_softmax_2d"])
def test_d2l_masked_softmax(name: str) -> None:
    f = load(name)
    doc = run_json(name)
    ref = d2l_masked_softmax(torch.tensor(f["q"], dtype=torch.float64), torch.tensor(f["valid_lens"]))
    np.testing.assert_allclose(doc["weights"], ref.numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(doc["output"], ref.numpy(), rtol=1e-12, atol=1e-15)  # V = I
    assert_file_expected(name, doc, atol=5e-5)


def test_d2l_masked_softmax_zero_length_as_d2l_and_as_attncli() -> None:
    f = load("d2l_masked_softmax")
    ref = d2l_masked_softmax(torch.tensor(f["q"], dtype=torch.float64), torch.tensor([0, 3]))
    doc = run_json("d2l_masked_softmax", "--valid-lens", "0,3")  # the file's mask value -1e6: uniform, as d2l
    np.testing.assert_allclose(doc["weights"], ref.numpy(), rtol=1e-12)
    assert np.allclose(np.array(doc["weights"])[0], 0.25)
    doc = run_json("d2l_masked_softmax", "--valid-lens", "0,3", "--mask-value", "-inf")
    assert np.array(doc["weights"])[0].sum() == 0 and doc["diagnostics"]["fully_masked_count"] == 2


def test_d2l_dot_product() -> None:
    f = load("d2l_dot_product")
    doc = run_json("d2l_dot_product")
    q, k, v = (torch.tensor(f[x], dtype=torch.float64) for x in "qkv")
    # d2l's DotProductAttention.forward (eval: dropout off)
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
    ref = torch.bmm(d2l_masked_softmax(scores, torch.tensor(f["valid_lens"])), v)
    np.testing.assert_allclose(doc["output"], ref.numpy(), rtol=1e-12)
    np.testing.assert_allclose(doc["output"], [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-12)  # d2l prints this
    assert_file_expected("d2l_dot_product", doc, atol=1e-8)


def test_d2l_additive() -> None:
    f = load("d2l_additive")
    doc = run_json("d2l_additive")
    q, k, v = (torch.tensor(f[x], dtype=torch.float64) for x in "qkv")
    w = {n: torch.tensor(a, dtype=torch.float64) for n, a in f["weights"].items()}
    # d2l's AdditiveAttention.forward with nn.Linear weights = the file's textbook weights transposed
    W_q, W_k, w_v = (torch.nn.Linear(20, 8, bias=False, dtype=torch.float64),
                     torch.nn.Linear(2, 8, bias=False, dtype=torch.float64),
                     torch.nn.Linear(8, 1, bias=False, dtype=torch.float64))
    with torch.no_grad():
        W_q.weight.copy_(w["W_q"].T)
        W_k.weight.copy_(w["W_k"].T)
        w_v.weight.copy_(w["w_v"][None, :])
        features = torch.tanh(W_q(q).unsqueeze(2) + W_k(k).unsqueeze(1))
        scores = w_v(features).squeeze(-1)
        weights = d2l_masked_softmax(scores, torch.tensor(f["valid_lens"]))
        ref = torch.bmm(weights, v)
    np.testing.assert_allclose(step(doc, "scores"), scores.numpy(), rtol=1e-12)
    np.testing.assert_allclose(doc["output"], ref.numpy(), rtol=1e-12)
    np.testing.assert_allclose(doc["output"], [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-12)  # d2l prints this
    assert_file_expected("d2l_additive", doc, atol=1e-8)


def test_nadaraya_watson() -> None:
    f = load("nadaraya_watson")
    doc = run_json("nadaraya_watson")
    x_test, x_train, y_train = (np.array(f[n], dtype=float)[:, 0] for n in "qkv")
    # d2l: attention_weights = softmax(-(x_test - x_train)² / 2); y_hat = attention_weights @ y_train
    ref = softmax64(-((x_test[:, None] - x_train[None, :]) ** 2) / 2) @ y_train
    np.testing.assert_allclose(np.array(doc["output"])[:, 0], ref, rtol=1e-10)
    assert_file_expected("nadaraya_watson", doc, atol=5e-5)
    # the data are f(x) = 2 sin x + x^0.8 plus N(0, 0.5²) noise: residuals are noise-sized
    resid = y_train - (2 * np.sin(x_train) + x_train**0.8)
    assert abs(resid.mean()) < 0.3 and 0.2 < resid.std() < 0.8
    assert x_test[0] == 0 and x_test[-1] == pytest.approx(4.9) and np.all(np.diff(x_train) >= 0)


def test_row_vector_query() -> None:
    doc = run_json("row_vector_query")
    # by hand: a = (4, 0, 2) / √4 = (2, 0, 1); α = (e², 1, e) / (e² + 1 + e); f(q) = α₁(1,0) + α₂(0,1) + α₃(1,1)
    z = math.e**2 + 1 + math.e
    a = np.array([math.e**2, 1, math.e]) / z
    np.testing.assert_allclose(doc["weights"], [a], rtol=1e-12)
    np.testing.assert_allclose(doc["output"], [[a[0] + a[2], a[1] + a[2]]], rtol=1e-12)
    assert_file_expected("row_vector_query", doc, atol=5e-5)


def test_multihead_example_per_head_by_hand() -> None:
    doc = run_json("multihead_cat_milk")
    X = np.array([[2, 2], [1, 3], [2, 2], [0, 4]], dtype=float)
    # identity weights, 2 heads of width 1: head h attends with softmax(x_h x_hᵀ / √1) over column h
    heads = [softmax64(X[:, [h]] @ X[:, [h]].T) @ X[:, [h]] for h in range(2)]
    np.testing.assert_allclose(doc["output"], np.hstack(heads), rtol=1e-12)


# ---- the command ------------------------------------------------------------------------------


def test_examples_lists_every_file_with_its_description() -> None:
    r = runner.invoke(app, ["examples"])
    assert r.exit_code == 0
    names = sorted(p.stem for p in EXAMPLES.glob("*.yaml"))
    listed = [line.split()[0] for line in r.output.split("\n\n")[0].splitlines() if not line.startswith(" ")]
    assert listed == names
    assert "(all 4 keys tie)" in r.output


def test_every_example_runs_and_has_a_source_comment() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        text = path.read_text()
        assert text.startswith("#"), f"{path.name}: no comment saying where it comes from"
        r = runner.invoke(app, ["examples", "run", path.stem, "-q"])
        assert r.exit_code == 0, f"{path.name}: {r.output}"


@pytest.mark.parametrize("args, code, needle", [
    (["examples", "show", "cat_milk_sweet"], 0, "softmax(QKᵀ)·V / sqrt(d)"),
    (["examples", "show", "cat_milk_sweet.yaml"], 0, "labels: [cat, milk, it, sweet]"),
    (["examples", "show", "no_such"], 2, "no example named 'no_such'"),
    (["examples", "run", "no_such"], 2, "the examples are"),
    (["examples", "run", "cat_milk_sweet", "--explain", "it,milk"], 0, "sim(it, milk) = q(it) · k(milk) = 2×1 + 2×3 = 8"),
    (["examples", "run", "d2l_dot_product", "--explain-row", "1:0", "--steps", "weights,output"], 0, "= (10, 11, 12, 13)"),
])
def test_examples_command_table(args: list[str], code: int, needle: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == code, r.output
    assert needle in r.output
