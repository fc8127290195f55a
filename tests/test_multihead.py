"""Self-attention and multi-head attention (`attncli self`, attncli.multihead) against PyTorch.

References, all independent of our code:
- torch.nn.MultiheadAttention itself (weights exported through a state dict .pt file);
- a plain per-head loop in float64 written here (slice the weights per head, attend, concatenate);
- d2l's MultiHeadAttention (chapter "Multi-Head Attention"), copied below, and its example shapes;
- hand computations for all-ones inputs (every key equal, so the weights are uniform over valid keys).
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from d2l_reference import masked_softmax as d2l_masked_softmax
from torch import nn
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core import plan as plan_mod
from attncli.core.engine import multihead
from attncli.core.problem import Options
from attncli.core.projections import init_projections
from attncli.errors import InputError
from attncli.io.files import Reader
from attncli.io.layouts import projections_from

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parent.parent / "attncli" / "examples"


def state_dict_file(module: nn.Module, path: Path) -> Path:
    torch.save(module.state_dict(), path)
    return path


def load(path: Path, prefix: str | None = None) -> Any:
    return projections_from(Reader().read(str(path)), str(path), prefix)


# ---- parity with torch.nn.MultiheadAttention --------------------------------------------

CASES = [  # (batch_first, bias, kdim, vdim, key padding, causal, average)
    (True, True, None, None, False, False, True),
    (False, True, None, None, True, False, False),
    (True, False, None, None, True, True, False),
    (False, False, 5, 7, True, False, True),
    (True, True, 5, 7, False, True, False),
    (True, True, 6, 6, True, True, True),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch_first,bias,kdim,vdim,padding,causal,average", CASES)
def test_matches_nn_multiheadattention(tmp_path: Path, dtype: str, batch_first: bool, bias: bool, kdim: int | None,
                                       vdim: int | None, padding: bool, causal: bool, average: bool) -> None:
    torch.manual_seed(0)
    E, H, B, T = 12, 3, 2, 4
    S = T if causal or kdim is None else 5
    mha = nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first).eval()
    with torch.no_grad():  # non-zero biases, so a misplaced bias shows
        for name, p in mha.named_parameters():
            if "bias" in name:
                p.uniform_(-0.5, 0.5)
    tdt = torch.float64 if dtype == "float64" else torch.float32
    mha = mha.to(tdt)
    path = state_dict_file(mha, tmp_path / "mha.pt")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, E, generator=g, dtype=tdt)
    key = torch.randn(B, S, kdim or E, generator=g, dtype=tdt)
    value = torch.randn(B, S, vdim or E, generator=g, dtype=tdt)
    if kdim is None:  # self-attention: one input
        key = value = x
    kpm = torch.zeros(B, S, dtype=torch.bool)
    if padding:
        kpm[0, -1] = kpm[1, -2:] = True  # True = ignore, never a whole row
    attn_mask = torch.triu(torch.ones(T, S, dtype=torch.bool), 1) if causal else None
    lay = (lambda a: a) if batch_first else (lambda a: a.transpose(0, 1))  # noqa: E731
    with torch.no_grad():
        out, w = mha(lay(x), lay(key), lay(value), key_padding_mask=kpm if padding else None, attn_mask=attn_mask,
                     need_weights=True, average_attn_weights=average)  # out: (T, B, E) when not batch_first

    inputs = [lay(a).numpy() for a in (x, key, value)]
    trace = multihead(inputs[0], None if kdim is None else inputs[1], None if kdim is None else inputs[2],
                      weights=load(path), heads=H, key_padding_mask=kpm.numpy() if padding else None,
                      options=Options(causal=causal), batch_first=batch_first)
    tol = 1e-10 if dtype == "float64" else 1e-5
    assert trace["output"].dtype == np.dtype(dtype)
    np.testing.assert_allclose(trace["output"], out.numpy(), atol=tol, rtol=0)
    ours = trace["avg_weights"] if average else trace["weights"]
    assert ours.shape == tuple(w.shape)
    np.testing.assert_allclose(ours, w.numpy(), atol=tol, rtol=0)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
def test_explicit_attn_mask_conventions_and_kpm_through_the_cli(tmp_path: Path) -> None:
    """nn.MultiheadAttention's boolean attn_mask (True = ignore) is --mask-convention drop; its
    (B·H, T, S) form is split per head; a float attn_mask is added; all combine with key padding."""
    torch.manual_seed(2)
    E, H, B, T = 8, 2, 2, 3
    mha = nn.MultiheadAttention(E, H, batch_first=True).eval()
    pt = state_dict_file(mha, tmp_path / "m.pt")
    x = torch.randn(B, T, E)
    np.save(tmp_path / "x.npy", x.numpy())
    drop = torch.rand(B * H, T, T) > 0.6
    drop[..., 0] = False  # keep key 0 for every query: no fully masked row
    kpm = torch.tensor([[False, False, True], [False, False, False]])
    np.save(tmp_path / "drop.npy", drop.numpy())
    np.save(tmp_path / "keep.npy", (~drop).numpy())
    np.save(tmp_path / "kpm.npy", kpm.numpy())
    fmask = torch.randn(T, T)
    np.save(tmp_path / "fmask.npy", fmask.numpy())
    with torch.no_grad():
        ref, _ = mha(x, x, x, attn_mask=drop, key_padding_mask=kpm)
        ref_f, _ = mha(x, x, x, attn_mask=fmask, key_padding_mask=kpm)
    base = ["self", str(tmp_path / "x.npy"), "--weights", str(pt), "--heads", str(H),
            "--key-padding-mask", str(tmp_path / "kpm.npy"), "--format", "json"]
    for extra, want in ((["--mask", str(tmp_path / "drop.npy"), "--mask-convention", "drop"], ref),
                        (["--mask", str(tmp_path / "keep.npy")], ref),  # keep is the default convention
                        (["--mask", str(tmp_path / "fmask.npy")], ref_f)):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 0, res.stderr
        np.testing.assert_allclose(np.asarray(json.loads(res.stdout)["output"]), want.numpy(), atol=1e-5, rtol=0)


def test_unbatched_input_matches_torch(tmp_path: Path) -> None:
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(6, 2).double().eval()
    x = torch.randn(5, 6, dtype=torch.float64)  # (T, E): unbatched
    with torch.no_grad():
        out, w = mha(x, x, x, average_attn_weights=False)
    trace = multihead(x.numpy(), weights=load(state_dict_file(mha, tmp_path / "u.pt")), heads=2, valid_lens=[4])
    with torch.no_grad():  # valid length 4: the last key is padding
        out4, w4 = mha(x, x, x, key_padding_mask=torch.tensor([False] * 4 + [True]), average_attn_weights=False)
    assert trace["output"].shape == (5, 6) and trace["weights"].shape == (2, 5, 5)
    np.testing.assert_allclose(trace["output"], out4.numpy(), atol=1e-10, rtol=0)
    np.testing.assert_allclose(trace["weights"], w4.numpy(), atol=1e-10, rtol=0)
    assert not np.allclose(out4.numpy(), out.numpy())  # the valid length did something
    full = multihead(x.numpy(), weights=load(tmp_path / "u.pt"), heads=2)
    np.testing.assert_allclose(full["output"], out.numpy(), atol=1e-10, rtol=0)
    np.testing.assert_allclose(full["weights"], w.numpy(), atol=1e-10, rtol=0)


# ---- a plain per-head loop ---------------------------------------------------------------


def loop_reference(X: np.ndarray, Y: np.ndarray, w: dict[str, np.ndarray], H: int) -> tuple[np.ndarray, np.ndarray]:
    """Float64, one batch entry, one head at a time: slice the weights, attend, concatenate."""
    dk, dv = w["W_q"].shape[1] // H, w["W_v"].shape[1] // H
    heads, weights = [], []
    for h in range(H):
        qs, vs = slice(h * dk, (h + 1) * dk), slice(h * dv, (h + 1) * dv)
        Q = X @ w["W_q"][:, qs] + w["b_q"][qs]
        K = Y @ w["W_k"][:, qs] + w["b_k"][qs]
        V = Y @ w["W_v"][:, vs] + w["b_v"][vs]
        S = Q @ K.T / math.sqrt(dk)
        A = np.exp(S - S.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        heads.append(A @ V)
        weights.append(A)
    return np.concatenate(heads, axis=1) @ w["W_o"] + w["b_o"], np.stack(weights)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_matches_a_plain_per_head_loop(backend: str) -> None:
    rng = np.random.default_rng(4)
    B, T, S, D, Dk, H = 2, 3, 5, 7, 4, 3
    w = {"W_q": rng.standard_normal((D, 6)), "W_k": rng.standard_normal((Dk, 6)), "W_v": rng.standard_normal((Dk, 9)),
         "W_o": rng.standard_normal((9, 5)), "b_q": rng.standard_normal(6), "b_k": rng.standard_normal(6),
         "b_v": rng.standard_normal(9), "b_o": rng.standard_normal(5)}
    X, Y = rng.standard_normal((B, T, D)), rng.standard_normal((B, S, Dk))
    trace = multihead(X, Y, weights=projections_from(w, "w"), heads=H, options=Options(backend=backend))
    for b in range(B):
        out, weights = loop_reference(X[b], Y[b], w, H)
        np.testing.assert_allclose(trace["output"][b], out, atol=1e-12, rtol=0)
        np.testing.assert_allclose(trace["weights"][b], weights, atol=1e-12, rtol=0)
    assert trace["concat"].shape == (B, T, 9) and trace["head_output"].shape == (B, H, T, 3)


# ---- d2l's MultiHeadAttention ------------------------------------------------------------


class D2LMultiHeadAttention(nn.Module):
    """d2l 10.5 MultiHeadAttention (dropout 0, bias=False), with its transpose_qkv / transpose_output."""

    def __init__(self, size: int, num_hiddens: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.W_q = nn.Linear(size, num_hiddens, bias=False)
        self.W_k = nn.Linear(size, num_hiddens, bias=False)
        self.W_v = nn.Linear(size, num_hiddens, bias=False)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=False)

    def split(self, X: torch.Tensor) -> torch.Tensor:
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1).permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid_lens: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.W_q(q)), self.split(self.W_k(k)), self.split(self.W_v(v))
        valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        self.attention_weights = d2l_masked_softmax(scores, valid_lens)
        out = torch.bmm(self.attention_weights, v)
        out = out.reshape(-1, self.num_heads, out.shape[1], out.shape[2]).permute(0, 2, 1, 3)
        return self.W_o(out.reshape(out.shape[0], out.shape[1], -1))


def test_d2l_example_through_the_cli(tmp_path: Path) -> None:
    """d2l: num_hiddens=100, num_heads=5, X ones (2,4,100), Y ones (2,6,100), valid lens [3,2] -> (2,4,100)."""
    torch.manual_seed(0)
    d2l = D2LMultiHeadAttention(100, 100, 5).eval()
    X, Y, vl = torch.ones(2, 4, 100), torch.ones(2, 6, 100), torch.tensor([3, 2])
    with torch.no_grad():
        ref = d2l(X, Y, Y, vl)
    np.save(tmp_path / "X.npy", X.numpy())
    np.save(tmp_path / "Y.npy", Y.numpy())
    pt = state_dict_file(d2l, tmp_path / "d2l.pt")
    res = runner.invoke(app, ["self", str(tmp_path / "X.npy"), "--memory", str(tmp_path / "Y.npy"), "--weights", str(pt),
                              "--heads", "5", "--valid-lens", "3,2", "--format", "json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    out = np.asarray(doc["output"])
    assert out.shape == (2, 4, 100) and doc["heads"] == 5
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5, rtol=0)
    # all keys are equal: uniform weights over the valid keys, 1/3 (batch 0) and 1/2 (batch 1), 0 beyond
    weights = np.asarray(doc["weights"])
    assert weights.shape == (2, 5, 4, 6)
    expect = np.zeros((2, 6))
    expect[0, :3], expect[1, :2] = 1 / 3, 1 / 2
    np.testing.assert_allclose(weights, np.broadcast_to(expect[:, None, None, :], weights.shape), atol=1e-7)
    # and the output is every value row, (1 W_v) W_o, in float64 by hand from the module's weights
    sd = {k: v.double().numpy() for k, v in d2l.state_dict().items()}
    row = np.ones(100) @ sd["W_v.weight"].T @ sd["W_o.weight"].T
    np.testing.assert_allclose(out, np.broadcast_to(row, out.shape), atol=1e-5, rtol=0)


# ---- initialisation, saving, reloading ---------------------------------------------------


def test_seeded_init_is_reproducible_and_as_pytorch_draws(tmp_path: Path) -> None:
    a = init_projections(8, 8, 8, seed=3)
    b = init_projections(8, 8, 8, seed=3)
    c = init_projections(8, 8, 8, seed=4)
    np.testing.assert_array_equal(a.W_q, b.W_q)
    assert not np.array_equal(a.W_q, c.W_q)
    # nn.MultiheadAttention: in_proj_weight (3E, E) xavier-uniform: bound sqrt(6 / (E + 3E)); zero biases;
    # out_proj as nn.Linear: bound 1/sqrt(E)
    assert np.abs(a.W_q).max() <= math.sqrt(6 / 32) and np.abs(a.W_q).max() > 0.8 * math.sqrt(6 / 32)
    assert np.abs(a.W_o).max() <= 1 / math.sqrt(8) and not np.any(a.b_q)
    lin = init_projections(10, 10, 10, d_k=4, seed=0, init="linear")
    assert lin.W_q.shape == (10, 4) and np.abs(lin.W_q).max() <= 1 / math.sqrt(10)
    assert lin.b_q is not None and np.abs(lin.b_q).max() > 0  # nn.Linear biases are not zero
    big = init_projections(200, 200, 200, seed=0, init="linear")
    assert abs(big.W_q.std() - 1 / math.sqrt(200) / math.sqrt(3)) < 0.002  # uniform(-b, b) has std b/sqrt(3)


def test_seeded_run_saves_weights_that_reload_to_the_same_output(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 3, 8)))
    args = ["self", str(tmp_path / "x.npy"), "--heads", "2", "--seed", "7", "--d-k", "6", "--init", "linear"]
    res = runner.invoke(app, args + ["--save", str(tmp_path / "run.npz"), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    first = np.asarray(json.loads(res.stdout)["output"])
    with np.load(tmp_path / "run.npz") as z:
        saved = {k: z[k] for k in z.files}
    assert saved["W_q"].shape == (8, 6) and saved["W_v"].shape == (8, 6) and saved["weights"].shape == (2, 2, 3, 3)
    again = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--heads", "2", "--weights", str(tmp_path / "run.npz"),
                                "--format", "json"])
    assert again.exit_code == 0, again.stderr
    np.testing.assert_allclose(np.asarray(json.loads(again.stdout)["output"]), first, atol=1e-12, rtol=0)
    torch_run = runner.invoke(app, args + ["--backend", "torch", "--format", "json"])
    assert torch_run.exit_code == 0, torch_run.stderr
    np.testing.assert_allclose(np.asarray(json.loads(torch_run.stdout)["output"]), first, atol=1e-12, rtol=0)


def test_linear_layer_names_from_the_notes_and_a_prefix(tmp_path: Path) -> None:
    """The notes' MultiheadAttention (nn.Linear q, k, v, no W_o) inside a bigger model, picked by --prefix."""

    class Notes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(4, 6)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn, self.other = Notes(), Notes()

    torch.manual_seed(6)
    model = Model().double()
    pt = state_dict_file(model, tmp_path / "model.pt")
    with pytest.raises(InputError, match="several modules.*--prefix"):
        load(pt)
    proj = load(pt, "attn")
    X = np.random.default_rng(6).standard_normal((1, 3, 4))
    w = {"W_q": model.attn.q.weight.detach().numpy().T, "W_k": model.attn.k.weight.detach().numpy().T,
         "W_v": model.attn.v.weight.detach().numpy().T, "b_q": model.attn.q.bias.detach().numpy(),
         "b_k": model.attn.k.bias.detach().numpy(), "b_v": model.attn.v.bias.detach().numpy(),
         "W_o": np.eye(6), "b_o": np.zeros(6)}
    trace = multihead(X, weights=proj, heads=2)
    assert "W_o" not in trace and "concat" not in trace  # no output projection: the concatenation is the output
    np.testing.assert_allclose(trace["output"][0], loop_reference(X[0], X[0], w, 2)[0], atol=1e-12)


# ---- the example and the terminal view -----------------------------------------------------


def test_cat_milk_two_heads_example() -> None:
    """attncli/examples/multihead_cat_milk.yaml: the notes' words as (state, taste) columns, one head each,
    identity weights: head h attends with the products of column h (scaled by sqrt(1) = 1)."""
    res = runner.invoke(app, ["self", str(EXAMPLES / "multihead_cat_milk.yaml"), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    X = np.array([[2.0, 2], [1, 3], [2, 2], [0, 4]])  # cat, milk, it, sweet as written in the notes
    for h in range(2):
        s = np.outer(X[:, h], X[:, h])
        a = np.exp(s - s.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(np.asarray(doc["weights"])[h], a, atol=1e-12)
        np.testing.assert_allclose(np.asarray(doc["output"])[:, h], a @ X[:, h], atol=1e-12)
    assert doc["labels"]["queries"] == ["cat", "milk", "it", "sweet"]


def test_terminal_view_per_head_and_head_selection(tmp_path: Path) -> None:
    res = runner.invoke(app, ["self", str(EXAMPLES / "multihead_cat_milk.yaml")])
    assert res.exit_code == 0, res.stderr
    for text in ("X: the input", "Q = X · W_q", "head 0 of 2", "head 1 of 2", "concat(head_0, …, head_1)",
                 "avg_weights"):
        assert text in res.stdout, text
    one = runner.invoke(app, ["self", str(EXAMPLES / "multihead_cat_milk.yaml"), "--head", "1",
                              "--save", str(tmp_path / "all.npz")])
    assert one.exit_code == 0, one.stderr
    assert "head 1: weights" in one.stdout and "head 0 of" not in one.stdout
    with np.load(tmp_path / "all.npz") as z:
        assert z["weights"].shape == (2, 4, 4)  # the file keeps every head


# ---- bad input: one line, exit 2 ---------------------------------------------------------


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 3, 8)))
    np.savez(tmp_path / "wrong.npz", W_q=np.ones((5, 8)), W_k=np.ones((8, 8)), W_v=np.ones((8, 8)))
    np.savez(tmp_path / "nok.npz", W_q=np.ones((8, 8)), W_k=np.ones((8, 4)), W_v=np.ones((8, 8)))
    np.savez(tmp_path / "noweights.npz", a=np.ones((8, 8)), b=np.ones(3))
    sd = nn.MultiheadAttention(8, 2).state_dict()
    del sd["out_proj.weight"]
    torch.save(sd, tmp_path / "missing.pt")
    d2l = D2LMultiHeadAttention(8, 8, 2).state_dict()
    del d2l["W_v.weight"]
    torch.save(d2l, tmp_path / "missing_v.pt")
    torch.save(nn.MultiheadAttention(8, 2), tmp_path / "module.pt")  # a pickled module, not a state dict
    (tmp_path / "pickle.pt").write_bytes(pickle.dumps({"W_q": "not a tensor"}))
    torch.save({"W_q": torch.ones(8, 8), "note": torch.ones(1)}, tmp_path / "partial.pt")
    np.save(tmp_path / "kpm.npy", np.zeros((2, 4), dtype=bool))
    np.save(tmp_path / "mask.npy", np.zeros((5, 3, 3), dtype=bool))
    return tmp_path


BAD = [  # (args after X, words in the message)
    (["--weights", "wrong.npz"], ["W_q has shape (5, 8) but X has width 8", "expected (8, ...)"]),
    (["--weights", "nok.npz"], ["W_k has shape (8, 4)", "d_k = 8"]),
    (["--heads", "3", "--seed", "0"], ["3 heads do not divide d_k = 8"]),
    (["--heads", "3", "--weights", "wrong.npz"], ["W_q has shape (5, 8)"]),
    (["--weights", "noweights.npz"], ["has no projection weights", "in_proj_weight"]),
    (["--weights", "missing.pt"], ["no 'out_proj.weight'"]),
    (["--weights", "missing_v.pt"], ["no 'W_v.weight'"]),
    (["--weights", "module.pt"], ["only state dicts are read"]),
    (["--weights", "pickle.pt"], ["pt"]),
    (["--weights", "partial.pt"], ["no 'W_k'"]),
    (["--key-padding-mask", "kpm.npy"], ["key padding mask has shape (2, 4); expected (2, 3)"]),
    (["--mask", "mask.npy", "--heads", "2"], ["mask has shape (5, 3, 3)"]),
    (["--head", "2", "--heads", "2"], ["head 2 does not exist: there are 2 heads"]),
    (["--weights", "wrong.npz", "--d-k", "4"], ["--d-k: applies only when the weights are initialised"]),
    (["--memory", "kpm.npy"], ["memory"]),
]


@pytest.mark.parametrize("args,words", BAD)
def test_bad_input_is_one_line_and_exit_2(bad: Path, args: list[str], words: list[str]) -> None:
    full = ["self", str(bad / "x.npy"), *[str(bad / a) if a.endswith((".npz", ".pt", ".npy")) else a for a in args]]
    res = runner.invoke(app, full)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attncli: error: "), res.stderr
    assert "Traceback" not in res.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_fully_masked_rows_zero_by_default_uniform_with_d2l_mask_value(tmp_path: Path) -> None:
    """Valid length 0 for batch 0: every key masked. By default the weights are 0, so concat = 0 and
    output = b_o (by hand); with --mask-value -1e6 (d2l) the weights are uniform, 1/S, as d2l's masked_softmax."""
    rng = np.random.default_rng(8)
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 3, 4)))
    w = {"W_q": rng.standard_normal((4, 4)), "W_k": rng.standard_normal((4, 4)), "W_v": rng.standard_normal((4, 4)),
         "W_o": rng.standard_normal((4, 4)), "b_o": rng.standard_normal(4)}
    np.savez(tmp_path / "w.npz", **w)
    args = ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "w.npz"), "--heads", "2", "--valid-lens", "0,3",
            "--format", "json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    np.testing.assert_array_equal(np.asarray(doc["weights"])[0], 0.0)
    np.testing.assert_allclose(np.asarray(doc["output"])[0], np.broadcast_to(w["b_o"], (3, 4)), atol=1e-12)
    assert "query 2 (batch 0, head 1) has every key masked" in res.stderr
    d2l = runner.invoke(app, args + ["--mask-value", "-1e6"])
    assert d2l.exit_code == 0, d2l.stderr
    np.testing.assert_allclose(np.asarray(json.loads(d2l.stdout)["weights"])[0], 1 / 3, atol=1e-12)


def test_cli_sequence_first_layout_with_separate_key_and_value_inputs(tmp_path: Path) -> None:
    """--no-batch-first reads (T, B, D) as PyTorch's default layout; --memory/--values are key and value
    of an nn.MultiheadAttention with kdim/vdim (q_proj_weight, k_proj_weight, v_proj_weight)."""
    torch.manual_seed(9)
    mha = nn.MultiheadAttention(6, 3, kdim=4, vdim=5).eval()  # batch_first=False
    q, k, v = torch.randn(3, 2, 6), torch.randn(5, 2, 4), torch.randn(5, 2, 5)  # (T, B, D)
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", a.numpy())
    with torch.no_grad():
        ref, _ = mha(q, k, v)
    res = runner.invoke(app, ["self", str(tmp_path / "q.npy"), "--memory", str(tmp_path / "k.npy"), "--values",
                              str(tmp_path / "v.npy"), "--no-batch-first", "--heads", "3", "--weights",
                              str(state_dict_file(mha, tmp_path / "kv.pt")), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    out = np.asarray(json.loads(res.stdout)["output"])
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5, rtol=0)  # (T, B, E), as PyTorch returns it
    given = [str(tmp_path / "q.npy"), "--memory", str(tmp_path / "k.npy"), "--values", str(tmp_path / "v.npy"),
             "--no-batch-first", "--heads", "3", "--weights", str(tmp_path / "kv.pt")]
    np.save(tmp_path / "want.npy", ref.numpy())  # check reads the expected output in the same layout
    res = runner.invoke(app, ["check", str(tmp_path / "want.npy"), *given])
    assert res.exit_code == 0, res.stdout + res.stderr
    np.save(tmp_path / "bad.npy", ref.numpy() + 0.5)  # off by 0.5 everywhere: a mismatch
    res = runner.invoke(app, ["check", str(tmp_path / "bad.npy"), *given])
    assert res.exit_code == 1, res.stdout + res.stderr


def test_permuting_the_tokens_permutes_the_output() -> None:
    """Self-attention without masks is permutation-equivariant: output(P X) = P output(X)."""
    rng = np.random.default_rng(10)
    X = rng.standard_normal((5, 8))
    proj = init_projections(8, 8, 8, seed=1, init="linear")
    perm = rng.permutation(5)
    a = multihead(X, weights=proj, heads=4)["output"]
    b = multihead(X[perm], weights=proj, heads=4)["output"]
    np.testing.assert_allclose(b, a[perm], atol=1e-12)


def test_output_only_never_holds_the_weights_and_matches(tmp_path: Path) -> None:
    """`self --steps output` (and `--save out.npy`) take the output-only path: the same output as
    the full run, no per-head weights in the result."""
    x = np.random.default_rng(3).standard_normal((2, 37, 8))
    np.save(tmp_path / "x.npy", x)
    base = ["self", str(tmp_path / "x.npy"), "--heads", "2", "--seed", "1", "--causal"]
    full = json.loads(runner.invoke(app, [*base, "--format", "json"]).stdout)
    res = runner.invoke(app, [*base, "--steps", "head_output,output", "--format", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert [s["name"] for s in got["steps"]] == ["head_output", "output"] and "weights" not in got
    assert got["path"] == "blocked"
    np.testing.assert_allclose(got["output"], full["output"], rtol=0, atol=1e-12)
    res = runner.invoke(app, [*base, "--save", str(tmp_path / "out.npy"), "--quiet"])
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), full["output"], rtol=0, atol=1e-12)


def test_big_view_shows_exact_corner_rows_of_each_head(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Per-head weights over the (lowered) limit: the view shows the first and last queries' rows of
    each head and of avg_weights, equal to the full computation's."""

    monkeypatch.setattr(plan_mod, "VIEW_CELLS", 1000)  # 2 heads × 40 × 40 = 3200 weights; 12 rows of each: 960
    x = np.random.default_rng(4).standard_normal((40, 4))
    np.save(tmp_path / "x.npy", x)
    base = ["self", str(tmp_path / "x.npy"), "--heads", "2", "--seed", "2"]
    full = json.loads(runner.invoke(app, [*base, "--format", "json"]).stdout)
    res = runner.invoke(app, [*base, "--precision", "6"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "not computed" not in res.output and "only these rows were computed" in res.stdout
    weights = np.asarray([s for s in full["steps"] if s["name"] == "weights"][0]["values"])  # (H, T, S)
    avg = np.asarray([s for s in full["steps"] if s["name"] == "avg_weights"][0]["values"])  # (T, S)
    tables = res.stdout.split("head_h = ")[0].split("weights = softmax")[1:]
    assert len(tables) == 2  # one table per head
    for h, table in enumerate(tables):
        row = next(line for line in table.splitlines() if line.startswith("│ q39 "))
        cells = [c.strip() for c in row.split("│")[2:-1]]
        assert cells[0] == f"{weights[h, 39, 0]:.6f}" and cells[-1] == f"{weights[h, 39, 39]:.6f}"
    avg_table = res.stdout.split("avg_weights = ")[1]
    row = next(line for line in avg_table.splitlines() if line.startswith("│ q39 "))
    assert [c.strip() for c in row.split("│")[2:-1]][0] == f"{avg[39, 0]:.6f}"
    norm = runner.invoke(app, [*base, "--scaling", "norm"])  # ‖S‖_F needs every score: no corner rows alone
    assert norm.exit_code == 0 and "the 3,200 attention weights are not computed" in norm.stderr, norm.output
