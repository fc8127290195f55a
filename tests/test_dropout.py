"""Softmax variants: --hard (one-hot at the argmax) and --dropout P --seed S (inverted dropout as
nn.Dropout in training), on both backends, against references computed here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from attncli import attend
from attncli.cli import app
from attncli.errors import InputError

BACKENDS = ["numpy", "torch"]
runner = CliRunner()


def _inputs(seed: int = 0, B: int = 2, m: int = 4, n: int = 6, d: int = 3) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(B, m, d)), rng.normal(size=(B, n, d)), rng.normal(size=(B, n, 2))


# ---- hard attention -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("score", ["scaled-dot", "additive", "cosine", "gaussian"])
def test_hard_is_one_hot_at_the_argmax(backend: str, score: str) -> None:
    q, k, v = _inputs(1)
    t = attend(q, k, v, score=score, hard=True, valid_lens=np.array([3, 6]), backend=backend)
    soft = t["softmax"]
    np.testing.assert_array_equal(t.weights, t["hard"])  # the weights that multiplied V (issue 12)
    ref = F.one_hot(torch.from_numpy(soft).argmax(-1), soft.shape[-1]).double().numpy()  # PyTorch's argmax
    np.testing.assert_array_equal(t["hard"], ref)
    assert set(np.unique(t["hard"])) == {0.0, 1.0} and (t["hard"].sum(-1) == 1).all()
    # the output picks the value row of each query's top key
    top = soft.argmax(-1)
    np.testing.assert_allclose(t.output, np.take_along_axis(v, top[..., None], axis=1), rtol=1e-15)
    assert t.names()[-3:] == ["softmax", "hard", "output"]
    assert t.step("output").formula.startswith("output = hard")
    assert (t["hard"][0, :, 3:] == 0).all()  # masked keys are never chosen


@pytest.mark.parametrize("backend", BACKENDS)
def test_hard_ties_go_to_the_first_key_and_dead_rows_stay_zero(backend: str) -> None:
    # row 0: scores 1, 3, 3 -> tie between keys 1 and 2 -> key 1. row 1: every key masked -> zeros.
    q = np.array([[1.0], [1.0]])
    k = np.array([[1.0], [3.0], [3.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    mask = np.array([[True, True, True], [False, False, False]])
    t = attend(q, k, v, score="dot", hard=True, mask=mask, backend=backend)
    np.testing.assert_array_equal(t["hard"], [[0, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(t.output, [[2.0], [0.0]])
    # with d2l's finite mask value the dead row is uniform, so hard attention picks its first key
    t = attend(q, k, v, score="dot", hard=True, mask=mask, mask_value=-1e6, backend=backend)
    np.testing.assert_array_equal(t["hard"], [[0, 1, 0], [1, 0, 0]])


# ---- dropout --------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 42])
def test_dropout_mask_is_numpy_default_rng_and_same_on_both_backends(p: float, seed: int) -> None:
    q, k, v = _inputs(2)
    runs = [attend(q, k, v, dropout=p, seed=seed, backend=b) for b in BACKENDS]
    np.testing.assert_array_equal(runs[0]["dropout"] == 0, runs[1]["dropout"] == 0)  # the same keys dropped
    np.testing.assert_allclose(runs[0]["dropout"], runs[1]["dropout"], rtol=1e-14)  # softmax rounding aside
    np.testing.assert_allclose(runs[0].output, runs[1].output, rtol=1e-13)
    w = attend(q, k, v, backend="numpy").weights  # the same run without dropout
    keep = np.random.default_rng(seed).random(w.shape) >= p  # the documented draw
    np.testing.assert_allclose(runs[0]["dropout"], np.where(keep, w / (1 - p), 0.0), rtol=1e-15)
    np.testing.assert_allclose(runs[0].output, np.where(keep, w / (1 - p), 0.0) @ v, rtol=1e-13)
    assert runs[0].names()[-3:] == ["softmax", "dropout", "output"]


def test_dropout_scales_kept_weights_like_nn_dropout() -> None:
    # nn.Dropout in training multiplies what it keeps by 1/(1-p): compare on the positions both keep
    q, k, v = _inputs(3, B=1, m=50, n=40)
    p = 0.3
    t = attend(q, k, v, dropout=p, seed=5)
    torch.manual_seed(0)
    ref = torch.nn.Dropout(p).train()(torch.from_numpy(t["softmax"])).numpy()
    both = (ref != 0) & (t["dropout"] != 0)
    assert both.sum() > 500
    np.testing.assert_allclose(t["dropout"][both], ref[both], rtol=1e-15)


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_kept_fraction_is_within_one_percent(p: float) -> None:
    # 1 x 400 x 600 = 240,000 weights: the kept fraction's standard error is < 0.1%
    rng = np.random.default_rng(9)
    q, k = rng.normal(size=(400, 4)), rng.normal(size=(600, 4))
    t = attend(q, k, np.ones((600, 1)), dropout=p, seed=11)
    kept = float(np.mean(t["dropout"] != 0))
    assert abs(kept - (1 - p)) <= 0.01 * (1 - p)


def test_mean_output_over_seeds_approaches_no_dropout() -> None:
    q, k, v = _inputs(4, B=1, m=3, n=5)
    ref = attend(q, k, v).output
    p, runs = 0.4, 600
    outs = np.stack([attend(q, k, v, dropout=p, seed=s).output for s in range(runs)])
    err = np.abs(outs.mean(axis=0) - ref)
    se = outs.std(axis=0) / math.sqrt(runs)  # standard error of the mean
    assert (err <= 5 * se + 1e-12).all(), (err, se)
    assert (outs.std(axis=0) > 0).all()  # dropout did change things


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_edges(backend: str) -> None:
    q, k, v = _inputs(5)
    t = attend(q, k, v, dropout=0.0, backend=backend)
    assert "dropout" not in t.names()  # evaluation mode: no step
    t = attend(q, k, v, dropout=1.0, backend=backend)  # nn.Dropout(1.0) zeroes everything
    assert (t["dropout"] == 0).all() and (t.output == 0).all()
    t = attend(q, k, v, hard=True, dropout=0.5, seed=3, backend=backend)  # hard first, then dropout
    assert t.names()[-4:] == ["softmax", "hard", "dropout", "output"]
    keep = np.random.default_rng(3).random(t["softmax"].shape) >= 0.5
    np.testing.assert_array_equal(t["dropout"], np.where(keep, 2 * t["hard"], 0))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InputError, match="dropout must be a probability"):
            attend(q, k, v, dropout=bad)
    with pytest.raises(InputError, match="seed must be 0 or more"):
        attend(q, k, v, dropout=0.5, seed=-1)


def test_cli_hard_and_dropout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    q, k, v = _inputs(6, B=1)
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", a)
    files = [str(tmp_path / f"{n}.npy") for n in "qkv"]
    table = [
        (["--hard"], 0, ["softmax", "hard", "output"]),
        (["--dropout", "0.25", "--seed", "7"], 0, ["softmax", "dropout", "output"]),
        (["--hard", "--dropout", "0.5"], 0, ["softmax", "hard", "dropout", "output"]),
        (["--dropout", "2"], 2, None),
    ]
    for args, code, tail in table:
        res = runner.invoke(app, ["run", *files, "-f", "json", *args])
        assert res.exit_code == code, (args, res.output)
        if tail is None:
            continue
        doc = json.loads(res.stdout)
        names = [s["name"] for s in doc["steps"]]
        assert names[-len(tail):] == tail
        used = np.array(doc["steps"][-2]["values"])
        np.testing.assert_allclose(doc["output"], used @ v, rtol=1e-13)
        # issue 12: the top-level weights are the ones that multiplied V, so output = weights @ V
        np.testing.assert_array_equal(np.array(doc["weights"]), used)
        np.testing.assert_allclose(doc["output"], np.array(doc["weights"]) @ v, rtol=1e-13)
    doc = json.loads(runner.invoke(app, ["run", *files, "-f", "json", "--dropout", "0.25", "--seed", "7"]).stdout)
    w = np.array(next(s["values"] for s in doc["steps"] if s["name"] == "softmax"))
    keep = np.random.default_rng(7).random(w.shape) >= 0.25
    np.testing.assert_allclose(doc["steps"][-2]["values"], np.where(keep, w / 0.75, 0), rtol=1e-15)
