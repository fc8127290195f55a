"""Every scoring function: hand-computed float64 cases, parity with independent PyTorch modules
written here (d2l's AdditiveAttention, a Luong 'general' layer, ...), the d2l additive example,
and the scaling variants. Properties and weights files live in test_scores_props.py and
test_scores_weights.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from d2l_reference import masked_softmax
from torch import nn

from attncli import attend

BACKENDS = ["numpy", "torch"]


def softmax_list(xs: list[float]) -> list[float]:
    """Plain-Python softmax: the float64 reference for hand-computed rows."""
    e = [math.exp(x - max(xs)) for x in xs]
    return [x / sum(e) for x in e]


# ---- hand-computed cases (float64, every number derived in the comments) ------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_general_by_hand(backend: str) -> None:
    # q = (1, 2, 0), W (3x2) = [[1,0],[0,2],[5,5]]: qᵀW = (1, 4); keys (1,0), (0,1), (1,1) -> 1, 4, 5
    q = np.array([[1.0, 2.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    W = np.array([[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
    t = attend(q, k, v, score="general", params={"W": W}, backend=backend)
    np.testing.assert_allclose(t["scores"], [[1.0, 4.0, 5.0]], rtol=1e-15)
    np.testing.assert_allclose(t["k_proj"], [[1, 0, 5], [0, 2, 5], [1, 2, 10]], rtol=1e-15)  # W k_j
    w = softmax_list([1, 4, 5])
    np.testing.assert_allclose(t.weights[0], w, rtol=1e-14)
    np.testing.assert_allclose(t.output[0, 0], w[0] + 2 * w[1] + 3 * w[2], rtol=1e-14)
    # with bias b = (1, 1, 1): every score of the row gains q·b = 3
    t = attend(q, k, v, score="bilinear", params={"W": W, "b": np.ones(3)}, backend=backend)
    np.testing.assert_allclose(t["scores"], [[4.0, 7.0, 8.0]], rtol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["tanh", "relu", "identity"])
def test_additive_by_hand(backend: str, activation: str) -> None:
    # d_q = 1, d_k = 2, h = 2. W_q = [[1, -1]], W_k = [[1, 0], [0, 2]], w_v = (2, 1), b = (0, 0.5)
    # q = 0.5: q W_q = (0.5, -0.5). keys (1, 0) -> (1, 0); (0, 1) -> (0, 2)
    # pre-activation: (1.5, 0.0) and (0.5, 2.0); score = 2·act(x0) + act(x1)
    act = {"tanh": math.tanh, "relu": lambda x: max(x, 0.0), "identity": lambda x: x}[activation]
    q = np.array([[0.5]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])
    v = np.array([[1.0, 0.0], [0.0, 1.0]])
    p = {"W_q": np.array([[1.0, -1.0]]), "W_k": np.array([[1.0, 0.0], [0.0, 2.0]]), "w_v": np.array([2.0, 1.0]),
         "b": np.array([0.0, 0.5])}
    t = attend(q, k, v, score="additive", activation=activation, params=p, backend=backend)
    want = [2 * act(1.5) + act(0.0), 2 * act(0.5) + act(2.0)]
    np.testing.assert_allclose(t["scores"][0], want, rtol=1e-14)
    np.testing.assert_allclose(t["features"][0, 1], [act(0.5), act(2.0)], rtol=1e-14)
    np.testing.assert_allclose(t.output[0], softmax_list(want), rtol=1e-14)  # V = I: output = weights
    assert t.names() == ["q_proj", "k_proj", "features", "scores", "weights", "output"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cosine_by_hand(backend: str) -> None:
    # q = (3, 4) against (3, 4), (4, -3), (-6, -8): cosines 1, 0, -1 (3-4-5 triangles); a zero key scores 0
    q = np.array([[3.0, 4.0]])
    k = np.array([[3.0, 4.0], [4.0, -3.0], [-6.0, -8.0], [0.0, 0.0]])
    v = np.eye(4)
    t = attend(q, k, v, score="cosine", backend=backend)
    np.testing.assert_allclose(t["scores"], [[1.0, 0.0, -1.0, 0.0]], atol=1e-15)
    np.testing.assert_allclose(t["q_normalised"], [[0.6, 0.8]], rtol=1e-15)
    np.testing.assert_allclose(t.weights[0], softmax_list([1, 0, -1, 0]), rtol=1e-14)
    t = attend(q, k, v, score="cosine", temperature=0.1, backend=backend)  # sharpened: scores / 0.1
    np.testing.assert_allclose(t.weights[0], softmax_list([10, 0, -10, 0]), rtol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gaussian_by_hand(backend: str) -> None:
    # Nadaraya-Watson with σ = 1: q = 0, keys 0, 1, 2 -> -d²/2 = 0, -0.5, -2
    q, k = np.array([[0.0]]), np.array([[0.0], [1.0], [2.0]])
    v = np.array([[10.0], [20.0], [30.0]])
    t = attend(q, k, v, score="gaussian", backend=backend)
    np.testing.assert_allclose(t["scores"], [[0.0, -0.5, -2.0]], atol=1e-14)
    w = softmax_list([0, -0.5, -2])
    np.testing.assert_allclose(t.output[0, 0], 10 * w[0] + 20 * w[1] + 30 * w[2], rtol=1e-13)
    # σ = 2: -d²/8 = 0, -0.125, -0.5
    t = attend(q, k, v, score="gaussian", bandwidth=2.0, backend=backend)
    np.testing.assert_allclose(t["scores"], [[0.0, -0.125, -0.5]], atol=1e-14)
    # d2l's learned w = 2: -((q - k) w)² / 2 = 0, -2, -8
    t = attend(q, k, v, score="nadaraya-watson", params={"w": np.array([2.0])}, backend=backend)
    np.testing.assert_allclose(t["scores"], [[0.0, -2.0, -8.0]], atol=1e-13)
    # two features, q = (1, 1), k = (4, 5): ‖q - k‖² = 9 + 16 = 25 -> -12.5; far from the origin too
    for shift in (0.0, 1e6):
        t = attend(np.array([[1.0, 1.0]]) + shift, np.array([[4.0, 5.0], [1.0, 1.0]]) + shift, np.eye(2),
                   score="gaussian", backend=backend)
        np.testing.assert_allclose(t["sq_dist"], [[25.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["identity", "tanh"])
def test_location_by_hand(backend: str, activation: str) -> None:
    # keys (1,0), (0,1), (1,1); W = (1, 2), b = -1: Wᵀk + b = 0, 1, 2, the same row for both queries
    act = {"tanh": math.tanh, "identity": lambda x: x}[activation]
    q = np.zeros((2, 5))  # the query plays no part: any width, its count sets the rows
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[0.0], [1.0], [2.0]])
    t = attend(q, k, v, score="location", activation=activation, params={"W": np.array([1.0, 2.0]), "b": -1.0},
               backend=backend)
    row = [act(0.0), act(1.0), act(2.0)]
    np.testing.assert_allclose(t["scores"], [row, row], atol=1e-15)
    w = softmax_list(row)
    np.testing.assert_allclose(t.output[:, 0], [w[1] + 2 * w[2]] * 2, rtol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scaling_variants_by_hand(backend: str) -> None:
    # Q = I (2x2), K rows (1,0), (0,1), (1,1): S = [[1,0,1],[0,1,1]], d = 2, n = 3, ‖S‖_F = 2
    q = np.eye(2)
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.eye(3)
    S = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    cases = {"sqrt-d": S / math.sqrt(2), "none": S, "norm": S / 2.0, "seq": S / (math.sqrt(2) * math.sqrt(3))}
    for rule, want in cases.items():
        t = attend(q, k, v, score="dot", scaling=rule, backend=backend)
        got = t["scaled"] if "scaled" in t else t["scores"]
        np.testing.assert_allclose(got, want, rtol=1e-15, err_msg=rule)
        np.testing.assert_allclose(t.weights[0], softmax_list(list(want[0])), rtol=1e-14, err_msg=rule)
    t = attend(q, k, v, score="scaled-dot", temperature=4.0, backend=backend)  # sqrt-d, then / T
    np.testing.assert_allclose(t["scaled"], S / math.sqrt(2) / 4.0, rtol=1e-15)
    t = attend(q, k, v, score="cosine", scaling="norm", backend=backend)  # cosine S: rows 1,0,1/√2 | 0,1,1/√2
    c = 1 / math.sqrt(2)
    Sc = np.array([[1, 0, c], [0, 1, c]])
    np.testing.assert_allclose(t["scaled"], Sc / math.sqrt(3.0), rtol=1e-14)  # ‖Sc‖_F² = 1 + ½ + 1 + ½ = 3


# ---- parity with independent PyTorch modules, batched and masked --------------------------


class AdditiveAttention(nn.Module):
    """d2l's AdditiveAttention, with the activation and the biases made choosable."""

    def __init__(self, key_size: int, query_size: int, num_hiddens: int, act: str = "tanh", bias: bool = False):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.act = {"tanh": torch.tanh, "relu": torch.relu, "identity": lambda x: x}[act]

    def scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = self.act(queries.unsqueeze(2) + keys.unsqueeze(1))
        return self.w_v(features).squeeze(-1)


class LuongGeneral(nn.Module):
    """Luong's 'general' score as in the PyTorch chatbot tutorial: q · attn(k), attn = Linear(d_k, d_q)."""

    def __init__(self, d_q: int, d_k: int, bias: bool):
        super().__init__()
        self.W = nn.Linear(d_k, d_q, bias=bias)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.bmm(q, self.W(k).transpose(1, 2))


class Location(nn.Module):
    """Location-based: act(W k + b) per key, the same row for every query."""

    def __init__(self, d_k: int, act: str):
        super().__init__()
        self.W = nn.Linear(d_k, 1)
        self.act = {"tanh": torch.tanh, "relu": torch.relu, "identity": lambda x: x}[act]

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.act(self.W(k)).squeeze(-1).unsqueeze(1).expand(-1, q.shape[1], -1)


class NWKernel(nn.Module):
    """d2l's NWKernelRegression score -((q - k) w)² / 2, summed over features, with a learned w."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.rand((d,)) + 0.5)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return -(((q.unsqueeze(2) - k.unsqueeze(1)) * self.w) ** 2).sum(-1) / 2


class Fixed(nn.Module):
    """A parameter-free score given as a function."""

    def __init__(self, fn):  # type: ignore[no-untyped-def]
        super().__init__()
        self.fn = fn

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.fn(q, k)


# (score, options, d_q, d_k, module factory)
PARITY = [
    ("dot", {}, 5, 5, lambda dq, dk: Fixed(lambda q, k: q @ k.transpose(1, 2))),
    ("scaled-dot", {}, 5, 5, lambda dq, dk: Fixed(lambda q, k: q @ k.transpose(1, 2) / math.sqrt(dq))),
    ("general", {}, 5, 3, lambda dq, dk: LuongGeneral(dq, dk, bias=False)),
    ("bilinear", {}, 4, 6, lambda dq, dk: LuongGeneral(dq, dk, bias=True)),
    ("additive", {}, 7, 3, lambda dq, dk: AdditiveAttention(dk, dq, 8)),
    ("concat", {"activation": "relu"}, 4, 4, lambda dq, dk: AdditiveAttention(dk, dq, 6, "relu", bias=True)),
    ("bahdanau", {"activation": "identity"}, 3, 5, lambda dq, dk: AdditiveAttention(dk, dq, 2, "identity")),
    ("cosine", {"temperature": 0.5}, 5, 5,
     lambda dq, dk: Fixed(lambda q, k: F.cosine_similarity(q.unsqueeze(2), k.unsqueeze(1), dim=-1) / 0.5)),
    ("gaussian", {"bandwidth": 1.7}, 3, 3, lambda dq, dk: Fixed(lambda q, k: -torch.cdist(q, k) ** 2 / (2 * 1.7**2))),
    ("gaussian", {}, 3, 3, lambda dq, dk: NWKernel(dq)),
    ("location", {}, 4, 3, lambda dq, dk: Location(dk, "tanh")),
    ("location", {"activation": "relu"}, 4, 3, lambda dq, dk: Location(dk, "relu")),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_query", [False, True])
@pytest.mark.parametrize(("score", "opts", "d_q", "d_k", "factory"), PARITY,
                         ids=[f"{c[0]}-{'-'.join(map(str, c[1].values())) or 'default'}" for c in PARITY])
def test_parity_with_torch_module(score: str, opts: dict, d_q: int, d_k: int, factory, backend: str,  # type: ignore[no-untyped-def]
                                  per_query: bool) -> None:
    torch.manual_seed(0)
    module = factory(d_q, d_k).double().eval()
    rng = np.random.default_rng(7)
    B, m, n, d_v = 2, 3, 5, 4
    q, k, v = rng.normal(size=(B, m, d_q)), rng.normal(size=(B, n, d_k)), rng.normal(size=(B, n, d_v))
    valid = np.array([[2, 5, 3], [1, 4, 5]]) if per_query else np.array([3, 5])
    with torch.no_grad():
        s = module.scores(torch.from_numpy(q), torch.from_numpy(k))
        w_ref = masked_softmax(s, torch.from_numpy(valid))
        out_ref = torch.bmm(w_ref, torch.from_numpy(v)).numpy()
    params = {name: p.detach().numpy() for name, p in module.state_dict().items()}  # PyTorch names
    t = attend(q, k, v, score=score, valid_lens=valid, params=params, backend=backend, **opts)
    np.testing.assert_allclose(t.weights, w_ref.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t.output, out_ref, rtol=1e-10, atol=1e-12)
    # float32 on the same inputs stays close to the float64 reference
    t32 = attend(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), score=score, valid_lens=valid,
                 params=params, backend=backend, **opts)
    np.testing.assert_allclose(t32.output, out_ref, rtol=1e-4, atol=1e-5)


def test_additive_textbook_names_match_nn_linear_names() -> None:
    """W_q = W_q.weightᵀ etc.: the textbook convention (q @ W_q) gives the module's numbers."""
    torch.manual_seed(1)
    mod = AdditiveAttention(3, 6, 5, bias=True).double().eval()
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 6)), rng.normal(size=(4, 3))
    sd = {n: p.detach().numpy() for n, p in mod.state_dict().items()}
    textbook = {"W_q": sd["W_q.weight"].T, "W_k": sd["W_k.weight"].T, "w_v": sd["w_v.weight"][0],
                "b": sd["W_q.bias"] + sd["W_k.bias"]}
    with torch.no_grad():
        ref = mod.scores(torch.from_numpy(q)[None], torch.from_numpy(k)[None])[0].numpy()
    t = attend(q, k, np.eye(4), score="additive", params=textbook)
    np.testing.assert_allclose(t["scores"], ref, rtol=1e-12)
    np.testing.assert_allclose(t["q_proj"], q @ textbook["W_q"], rtol=1e-12)


# ---- the d2l additive-attention example ---------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_d2l_additive_example(backend: str, seed: int) -> None:
    # d2l 10.3: queries normal (2,1,20), keys ones (2,10,2), values arange(40) as (1,10,4) twice, valid [2, 6].
    # Every key is the same, so the weights are uniform over the valid keys whatever the weights:
    # mean of value rows 0-1 = [2,3,4,5]; of rows 0-5 = [10,11,12,13].
    rng = np.random.default_rng(seed)
    queries = rng.normal(0, 1, (2, 1, 20))
    keys = np.ones((2, 10, 2))
    values = np.repeat(np.arange(40, dtype=float).reshape(1, 10, 4), 2, axis=0)
    t = attend(queries, keys, values, score="additive", hidden=8, seed=seed, valid_lens=np.array([2, 6]),
               backend=backend)
    np.testing.assert_allclose(t.output, [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-12)
    assert t["features"].shape == (2, 1, 10, 8)
    # and the d2l module itself (eval mode, its own random weights) gives the same output
    torch.manual_seed(seed)
    mod = AdditiveAttention(2, 20, 8).double().eval()
    params = {n: p.detach().numpy() for n, p in mod.state_dict().items()}
    t = attend(queries, keys, values, score="additive", params=params, valid_lens=np.array([2, 6]), backend=backend)
    with torch.no_grad():
        w = masked_softmax(mod.scores(torch.from_numpy(queries), torch.from_numpy(keys)), torch.tensor([2, 6]))
        ref = torch.bmm(w, torch.from_numpy(values)).numpy()
    np.testing.assert_allclose(t.output, ref, rtol=1e-12)
