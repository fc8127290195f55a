"""Score weights: files in every format (textbook and nn.Linear names), seeded nn.Linear-style
initialisation, what --save / JSON record, and one-line errors for bad weights (exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn
from typer.testing import CliRunner

from attncli import attend
from attncli.cli import app
from attncli.core.weights import linear_init
from attncli.errors import InputError

runner = CliRunner()
BACKENDS = ["numpy", "torch"]


class D2LAdditive(nn.Module):
    """d2l's AdditiveAttention (eval mode: no dropout), returning the output."""

    def __init__(self, key_size: int, query_size: int, num_hiddens: int):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        queries, keys = self.W_q(queries), self.W_k(keys)
        scores = self.w_v(torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))).squeeze(-1)
        return torch.bmm(torch.softmax(scores, dim=-1), values)


@pytest.fixture
def problem(tmp_path: Path) -> dict:
    """q (1,3,4), k (1,5,2), v (1,5,3) as .npy, a d2l module with h = 6 and its reference output."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(1, 3, 4)), rng.normal(size=(1, 5, 2)), rng.normal(size=(1, 5, 3))
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", a)
    torch.manual_seed(4)
    mod = D2LAdditive(2, 4, 6).double().eval()
    with torch.no_grad():
        ref = mod(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)).numpy()
    sd = {n: p.detach().numpy() for n, p in mod.state_dict().items()}
    textbook = {"W_q": sd["W_q.weight"].T, "W_k": sd["W_k.weight"].T, "w_v": sd["w_v.weight"][0]}
    return {"dir": tmp_path, "files": [str(tmp_path / f"{n}.npy") for n in "qkv"], "ref": ref, "state": mod.state_dict(),
            "textbook": textbook, "q": q, "k": k, "v": v}


def _write(problem: dict, name: str, content: dict) -> str:
    """Write ``content`` (name -> numpy array) as a weights file; the format follows the extension."""
    path = problem["dir"] / name
    ext = path.suffix
    if ext == ".npz":
        np.savez(path, **content)
    elif ext == ".pt":
        torch.save({k: torch.as_tensor(np.asarray(v)) for k, v in content.items()}, path)
    elif ext == ".json":
        path.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in content.items()}))
    else:
        path.write_text(yaml.safe_dump({k: np.asarray(v).tolist() for k, v in content.items()}))
    return str(path)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "torch_names"), [("w.npz", False), ("w.yaml", False), ("w.json", False),
                                                   ("w.pt", True), ("w.npz", True), ("w.json", True)])
def test_weights_files_give_the_d2l_module_output(problem: dict, name: str, torch_names: bool, backend: str) -> None:
    content = ({k: v.numpy() for k, v in problem["state"].items()} if torch_names else problem["textbook"])
    if name == "w.pt" and torch_names:
        path = str(problem["dir"] / name)
        torch.save(problem["state"], path)  # a real state_dict(), loaded with weights_only=True
    else:
        path = _write(problem, name, content)
    res = runner.invoke(app, ["run", *problem["files"], "--score", "additive", "--weights", path, "-f", "json",
                              "--backend", backend])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    np.testing.assert_allclose(doc["output"], problem["ref"], rtol=1e-12)
    # the weights used are recorded in the textbook convention, whatever the file called them
    for key, want in problem["textbook"].items():
        np.testing.assert_allclose(doc["params"][key], want, rtol=1e-15)


def test_problem_file_weights_mapping(problem: dict) -> None:
    doc = {"q": problem["q"].tolist(), "k": problem["k"].tolist(), "v": problem["v"].tolist(),
           "options": {"score": "additive"}, "weights": {k: v.tolist() for k, v in problem["textbook"].items()}}
    path = problem["dir"] / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["run", str(path), "-f", "json"])
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(json.loads(res.stdout)["output"], problem["ref"], rtol=1e-12)
    # --weights on the command line wins over the file's weights
    other = {k: 2 * v for k, v in problem["textbook"].items()}
    res = runner.invoke(app, ["run", str(path), "-f", "json", "--weights", _write(problem, "o.npz", other)])
    np.testing.assert_allclose(json.loads(res.stdout)["params"]["w_v"], other["w_v"])


# ---- initialisation ---------------------------------------------------------------------------


def test_linear_init_has_nn_linear_bound() -> None:
    # nn.Linear(fan_in, out) draws its weight from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform_, a=√5)
    for fan_in in (3, 20):
        torch.manual_seed(0)
        ref = nn.Linear(fan_in, 4000).weight.detach().numpy()
        ours = linear_init(np.random.default_rng(0), fan_in, ref.shape)
        bound = 1 / math.sqrt(fan_in)
        for a in (ref, ours):
            assert np.abs(a).max() <= bound and np.abs(a).max() > 0.999 * bound
            assert abs(a.mean()) < 0.01 * bound and abs(a.std() - bound / math.sqrt(3)) < 0.01 * bound


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_init_is_default_rng_in_parameter_order(backend: str) -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 2)), rng.normal(size=(2, 5, 3))
    t = attend(q, k, v, score="additive", hidden=7, seed=11, backend=backend)
    ref = np.random.default_rng(11)  # W_q (d_q, h) bound 1/√d_q, then W_k (d_k, h) 1/√d_k, then w_v (h,) 1/√h
    want = {"W_q": ref.uniform(-0.5, 0.5, (4, 7)), "W_k": ref.uniform(-1 / math.sqrt(2), 1 / math.sqrt(2), (2, 7)),
            "w_v": ref.uniform(-1 / math.sqrt(7), 1 / math.sqrt(7), (7,))}
    got = t.inputs_numpy()
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
    assert list(t.meta.params_initialised.names) == ["W_q", "W_k", "w_v"]
    assert (t.meta.params_initialised.seed, t.meta.params_initialised.hidden) == (11, 7)
    # h defaults to the query width; the seed to 0
    t = attend(q, k, v, score="additive")
    assert t.inputs_numpy()["W_q"].shape == (4, 4)
    np.testing.assert_array_equal(t.inputs_numpy()["W_q"], np.random.default_rng(0).uniform(-0.5, 0.5, (4, 4)))
    # general: W (d_q, d_k) with nn.Linear(d_k, d_q)'s bound 1/√d_k; location: W (d_k,) bound 1/√d_k
    t = attend(q, k, v, score="general", seed=2, backend=backend)
    np.testing.assert_array_equal(t.inputs_numpy()["W"], np.random.default_rng(2).uniform(-1 / math.sqrt(2), 1 / math.sqrt(2),
                                                                                          (4, 2)))
    t = attend(q, k, v, score="location", seed=2, backend=backend)
    np.testing.assert_array_equal(t.inputs_numpy()["W"], np.random.default_rng(2).uniform(-1 / math.sqrt(2), 1 / math.sqrt(2),
                                                                                          (2,)))


def test_seeded_runs_agree_across_backends() -> None:
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(6, 5)), rng.normal(size=(6, 2))
    for score in ("additive", "general", "location"):
        a, b = (attend(q, k, v, score=score, seed=5, hidden=3 if score == "additive" else None, backend=be)
                for be in BACKENDS)
        np.testing.assert_allclose(a.output, b.output, rtol=1e-12)


def test_save_records_the_weights_used(problem: dict) -> None:
    out = problem["dir"] / "run.npz"
    res = runner.invoke(app, ["run", *problem["files"], "--score", "concat", "--hidden", "5", "--seed", "9",
                              "--save", str(out), "-q"])
    assert res.exit_code == 0, res.output
    z = np.load(out)
    assert z["W_q"].shape == (4, 5) and z["W_k"].shape == (2, 5) and z["w_v"].shape == (5,)
    np.testing.assert_array_equal(z["W_q"], np.random.default_rng(9).uniform(-0.5, 0.5, (4, 5)))
    # the saved weights reproduce the run when given back as a weights file
    again = problem["dir"] / "w.npz"
    np.savez(again, W_q=z["W_q"], W_k=z["W_k"], w_v=z["w_v"])
    res = runner.invoke(app, ["run", *problem["files"], "--score", "additive", "--weights", str(again), "-f", "json"])
    np.testing.assert_allclose(json.loads(res.stdout)["output"], z["output"], rtol=1e-15)


# ---- bad weights: one line on stderr, exit 2 ----------------------------------------------------

W6 = {"W_q": np.ones((4, 6)), "W_k": np.ones((2, 6)), "w_v": np.ones(6)}
BAD = [
    # (weights, extra args, text the one-line message must contain)
    ({**W6, "W_k": np.ones((2, 5))}, [], "weight W_k has shape (2, 5); expected (d_k, h) = (2, 6); W_q sets h = 6"),
    ({**W6, "W_q": np.ones((3, 6))}, [], "weight W_q has shape (3, 6); expected (d_q, h) = (4, h); the width of Q is 4"),
    ({**W6, "w_v": np.ones((6, 1))}, [], "weight w_v has shape (6, 1); expected (h,) = (6,)"),
    ({"W_q": W6["W_q"], "W_k": W6["W_k"]}, [], "weight w_v is missing: --score additive takes W_q (d_q, h)"),
    ({**W6, "Wv": np.ones(6)}, [], "weight 'Wv' is not one that --score additive uses"),
    ({**W6, "W_q.weight": np.ones((6, 4))}, [], "weight W_q is given twice"),
    ({"W_q.weight": np.ones((6, 3)), "W_k.weight": np.ones((6, 2)), "w_v.weight": np.ones((1, 6))}, [],
     "weight W_q.weight has shape (6, 3); expected (h, d_q) = (h, 4) (nn.Linear layout)"),
    ({"W_q.weight": np.ones((6, 4)), "W_k.weight": np.ones((6, 2)), "w_v.weight": np.ones((2, 3))}, [],
     "weight w_v.weight has shape (2, 3); expected (1, h) = (1, 6) (nn.Linear layout)"),
    (W6, ["--hidden", "8"], "weight W_q has shape (4, 6); expected (d_q, h) = (4, 8); --hidden is 8"),
    (W6, ["--score", "dot"], "--score dot takes no weights"),
    ({"W_q": [[1, 2], [3]]}, [], "weight W_q is ragged"),
    ({**W6, "w_v": np.array([1.0, np.nan, 1, 1, 1, 1])}, [], "weight w_v holds NaN at index [1]"),
]


@pytest.mark.parametrize(("weights", "args", "message"), BAD, ids=[b[2][:40] for b in BAD])
def test_bad_weights_are_one_line_errors(problem: dict, weights: dict, args: list[str], message: str) -> None:
    if any(isinstance(v, list) for v in weights.values()):
        path = problem["dir"] / "w.json"
        path.write_text(json.dumps(weights))
    else:
        path = Path(_write(problem, "w.npz", weights))
    inputs = problem["files"]
    if "dot" in args:
        inputs = inputs[:1]  # self-attention: equal widths, so the complaint is about the weights
    res = runner.invoke(app, ["run", *inputs, "--score", "additive", "--weights", str(path), *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.stderr
    assert message in lines[0] and str(path) in lines[0], lines[0]


OPTION_ERRORS = [
    (["--score", "scaled-dot", "--activation", "relu"], "applies to --score additive / location, not scaled-dot"),
    (["--score", "cosine", "--bandwidth", "2"], "--bandwidth: applies to --score gaussian, not cosine"),
    (["--score", "gaussian", "--hidden", "3"], "applies to --score additive, not gaussian"),
    (["--score", "gaussian", "--bandwidth", "0"], "bandwidth must be a positive number"),
    (["--score", "additive", "--seed", "-3"], "seed must be 0 or more"),
    (["--score", "additive", "--weights", "Q"], "holds a single array; a weights file maps names to arrays"),
]


@pytest.mark.parametrize(("args", "message"), OPTION_ERRORS)
def test_option_errors(problem: dict, args: list[str], message: str) -> None:
    q = problem["files"][0]
    args = [q if a == "Q" else a for a in args]
    res = runner.invoke(app, ["run", q, *args])
    assert res.exit_code == 2, res.output
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_gaussian_w_and_bandwidth_conflict() -> None:
    with pytest.raises(InputError, match="either --bandwidth or a learned weight w"):
        attend(np.eye(2), score="gaussian", bandwidth=2.0, params={"w": 1.0})
    with pytest.raises(InputError, match=r"weight w has shape \(3,\); expected \(d_q,\) = \(2,\)"):
        attend(np.eye(2), score="gaussian", params={"w": np.ones(3)})
