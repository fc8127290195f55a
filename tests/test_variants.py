"""Every variant of the catalogue is named by ``check`` when the expected numbers carry its mistake.

The expected numbers of each case are computed IN THIS FILE with plain numpy float64 (the
formulas below, written independently of attncli's engine and of the variant functions), on
random inputs. Each case states the exact set of variants that reproduce them: the one made,
plus any that coincide with it on those inputs (both must be named), and no others.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attncli.check.variants import VARIANTS
from attncli.check.verdict import Tolerance, check
from attncli.core.problem import Options, Problem

M = N = 5  # queries, keys (equal, so Q/K swaps and transposes fit)
D, DV = 3, 2  # query/key width, value width (all different from N, from each other)
TOL = Tolerance(1e-9, 1e-9, "test")


def softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    """Plain softmax; rows of only -inf give zeros."""
    mx = np.max(s, axis=axis, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    z = e.sum(axis=axis, keepdims=True)
    return e / np.where(z > 0, z, 1.0)


def inputs(seed: int = 0, batch: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=batch + (M, D)), rng.normal(size=batch + (N, D)), rng.normal(size=batch + (N, DV)))


def named(q: np.ndarray, k: np.ndarray, v: np.ndarray, expected: np.ndarray, what: str = "output", **kw: object) -> set[str]:
    opts = {key: kw.pop(key) for key in list(kw) if key in Options.field_names()}
    problem = Problem.build(q, k, v, options=Options().merged(opts), **kw)  # type: ignore[arg-type]
    verdict = check(problem, expected, what=what, tolerance=TOL)
    assert not verdict.match, "the expected numbers must differ from the correct ones"
    return {e.name for e in verdict.explanations}


def T(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


# ---- scaling and softmax: (name, expected output from q, k, v, the variants that must be named) ----

CASES = {
    "no-scaling": lambda q, k, v: softmax(q @ T(k)) @ v,
    "scale-by-d": lambda q, k, v: softmax(q @ T(k) / D) @ v,
    "sqrt-value-width": lambda q, k, v: softmax(q @ T(k) / math.sqrt(DV)) @ v,
    "sqrt-key-count": lambda q, k, v: softmax(q @ T(k) / math.sqrt(N)) @ v,
    "scale-after-softmax": lambda q, k, v: softmax(q @ T(k)) @ v / math.sqrt(D),
    "softmax-over-queries": lambda q, k, v: softmax(q @ T(k) / math.sqrt(D), axis=-2) @ v,
    "q-k-swapped": lambda q, k, v: softmax(k @ T(q) / math.sqrt(D)) @ v,
    "unnormalised-weights": lambda q, k, v: np.exp(q @ T(k) / math.sqrt(D)) @ v,
    "no-softmax": lambda q, k, v: (q @ T(k) / math.sqrt(D)) @ v,
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_each_scaling_and_softmax_variant_is_named(name: str, seed: int) -> None:
    q, k, v = inputs(seed)
    assert named(q, k, v, CASES[name](q, k, v)) == {name}


def test_batched_inputs_are_named_too() -> None:
    q, k, v = inputs(3, batch=(2,))
    assert named(q, k, v, softmax(q @ T(k)) @ v / math.sqrt(D)) == {"scale-after-softmax"}


def test_variants_compare_weights_with_what_weights() -> None:
    q, k, v = inputs(4)
    # softmax over the queries: each column sums to 1
    assert named(q, k, v, softmax(q @ T(k) / math.sqrt(D), axis=0), what="weights") == {"softmax-over-queries"}
    assert named(q, k, v, softmax(q @ T(k)), what="weights") == {"no-scaling"}


def test_unscaled_dot_scaled_by_mistake() -> None:
    q, k, v = inputs(5)
    assert named(q, k, v, softmax(q @ T(k) / math.sqrt(D)) @ v, score="dot") == {"scaled-unscaled-score"}


def test_temperature_multiplied_instead_of_divided() -> None:
    q, k, v = inputs(6)
    t = 2.5
    assert named(q, k, v, softmax(q @ T(k) / math.sqrt(D) * t) @ v, temperature=t) == {"temperature-multiplied"}


def test_square_self_attention_q_k_swap_coincides_with_the_correct_math() -> None:
    # Q = K: K Qᵀ = Q Kᵀ, so the swap cannot be the explanation; the scaling one still is.
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, D))
    assert named(x, x, x, softmax(x @ x.T) @ x) == {"no-scaling"}


def test_coinciding_variants_are_both_named() -> None:
    # d = 2 and n = 4 keys: dividing by d (= 2) and by √n (= √4 = 2) give the same scores, so
    # softmax(QKᵀ/2)·V is reproduced by both "scale-by-d" and "sqrt-key-count".
    rng = np.random.default_rng(8)
    q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 3))
    assert named(q, k, v, softmax(q @ k.T / 2) @ v) == {"scale-by-d", "sqrt-key-count"}


def test_no_scaling_and_multiplied_temperature_coincide_when_t_squared_is_sqrt_d() -> None:
    # d = 16, T = 2: the correct scores are S/√d/T = S/8; forgetting √d gives S/T = S/2, and
    # multiplying by T gives S/√d·T = S/2 as well: both must be named.
    rng = np.random.default_rng(9)
    q, k, v = rng.normal(size=(3, 16)), rng.normal(size=(4, 16)), rng.normal(size=(4, 2))
    assert named(q, k, v, softmax(q @ k.T / 2) @ v, temperature=2.0) == {"no-scaling", "temperature-multiplied"}


def test_all_zero_scores() -> None:
    # Q = 0: every score is 0 and the weights uniform; the output halved is the scaling after the
    # softmax (√d = 2), and Σ V (weights exp(0) = 1) is the unnormalised softmax.
    n, d = 4, 4
    q, k = np.zeros((n, d)), np.random.default_rng(10).normal(size=(n, d))
    v = np.random.default_rng(11).normal(size=(n, 2))
    assert named(q, k, v, np.full((n, n), 1 / n) @ v / math.sqrt(d)) == {"scale-after-softmax"}
    assert named(q, k, v, np.ones((n, n)) @ v) == {"unnormalised-weights"}


# ---- masks ----------------------------------------------------------------------------

def masked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, fill: float = -np.inf) -> np.ndarray:
    s = np.where(keep, q @ T(k) / math.sqrt(D), fill)
    return softmax(s) @ v


def keep_from_lens(lens: list[int], shape: tuple[int, ...]) -> np.ndarray:
    """d2l valid lengths, one per batch entry: key j is kept when j < len."""
    j = np.arange(N)
    return np.stack([np.broadcast_to(j < n, shape[1:]) for n in lens])


@pytest.mark.parametrize("convention", ["keep", "drop"])
def test_mask_convention_inverted(convention: str) -> None:
    q, k, v = inputs(10)
    rng = np.random.default_rng(11)
    mask = rng.random((M, N)) < 0.5
    mask[:, 0], mask[:, 1] = True, False  # every row keeps and drops something either way
    keep = mask if convention == "keep" else ~mask
    expected = masked_attention(q, k, v, ~keep)  # the other convention
    assert named(q, k, v, expected, mask=mask, mask_convention=convention) == {"mask-inverted"}


@pytest.mark.parametrize("shift,name", [(+1, "valid-lens-plus-one"), (-1, "valid-lens-minus-one")])
def test_valid_lengths_off_by_one(shift: int, name: str) -> None:
    q, k, v = inputs(12, batch=(2,))
    lens = [2, 3]
    keep = keep_from_lens([n + shift for n in lens], (2, M, N))
    expected = masked_attention(q, k, v, keep)
    assert named(q, k, v, expected, valid_lens=np.array(lens)) == {name}


def test_minus_one_fill_as_d2l_gives_uniform_rows() -> None:
    q, k, v = inputs(13, batch=(2,))
    lens = [0, 3]  # batch 0: every key masked
    keep = keep_from_lens(lens, (2, M, N))
    expected = masked_attention(q, k, v, keep)
    expected[0] = v[0].mean(axis=0)  # d2l's -1e6 fill: softmax of equal scores is uniform
    assert named(q, k, v, expected, valid_lens=np.array(lens)) == {"mask-value-1e6"}


def test_inf_fill_instead_of_the_given_mask_value() -> None:
    q, k, v = inputs(14, batch=(2,))
    lens = [0, 3]
    keep = keep_from_lens(lens, (2, M, N))
    expected = masked_attention(q, k, v, keep)
    expected[0] = 0.0  # -inf fill with the guard: zero weights, zero output
    assert named(q, k, v, expected, valid_lens=np.array(lens), mask_value=-1e6) == {"mask-value-inf"}


def test_nan_on_fully_masked_rows() -> None:
    q, k, v = inputs(15, batch=(2,))
    lens = [3, 0]
    keep = keep_from_lens(lens, (2, M, N))
    expected = masked_attention(q, k, v, keep)
    expected[1] = np.nan  # torch.softmax of a row of -inf
    assert named(q, k, v, expected, valid_lens=np.array(lens)) == {"nan-on-fully-masked"}


# ---- dropout ----------------------------------------------------------------------------

def test_dropout_left_on_is_a_possibility_for_weights() -> None:
    q, k, v = inputs(16)
    w = softmax(q @ T(k) / math.sqrt(D))
    rng = np.random.default_rng(17)
    p = 0.25
    kept = rng.random(w.shape) >= p
    kept[0, 0] = False  # at least one dropped
    problem = Problem.build(q, k, v)
    verdict = check(problem, w * kept / (1 - p), what="weights", tolerance=TOL)
    exp = {e.name: e for e in verdict.explanations}
    assert set(exp) == {"dropout-at-eval"}
    assert exp["dropout-at-eval"].possible
    assert "1/(1-p) = 1.333" in exp["dropout-at-eval"].explanation


def test_dropout_left_on_is_found_in_the_output() -> None:
    q, k, v = inputs(18)
    v = np.random.default_rng(19).normal(size=(N, 4))  # wider values: the kept subset is determined
    w = softmax(q @ T(k) / math.sqrt(D))
    kept = np.ones_like(w, dtype=bool)
    kept[0, 1] = kept[2, 3] = kept[4, 0] = False
    p = 0.1
    expected = (w * kept / (1 - p)) @ v
    assert named(q, k, v, expected) == {"dropout-at-eval"}


@pytest.mark.parametrize("what", ["weights", "output"])
def test_dropout_is_found_in_numbers_rounded_to_4_decimals(what: str) -> None:
    from attncli.check.verdict import infer_tolerance

    q, k, v = inputs(22)
    w = softmax(q @ T(k) / math.sqrt(D))
    kept = np.ones_like(w, dtype=bool)
    kept[1, 2] = kept[3, 0] = False
    dropped = w * kept / 0.8  # p = 0.2
    expected = np.round(dropped if what == "weights" else dropped @ v, 4)
    tol = infer_tolerance([f"{x:.4f}" for x in expected.ravel()])
    verdict = check(Problem.build(q, k, v), expected, what=what, tolerance=tol)
    assert [e.name for e in verdict.explanations] == ["dropout-at-eval"]
    assert "p ≈ 0.2" in verdict.explanations[0].explanation


def test_output_times_a_constant_is_not_called_dropout() -> None:
    q, k, v = inputs(20)
    correct = softmax(q @ T(k) / math.sqrt(D)) @ v
    problem = Problem.build(q, k, v)
    verdict = check(problem, correct * 1.25, tolerance=TOL)
    assert verdict.explanations == []
    assert verdict.divergence is not None and verdict.divergence.ratio == pytest.approx(1.25)


# ---- the registry ---------------------------------------------------------------------

def test_every_variant_has_a_formula_and_an_explanation() -> None:
    for v in VARIANTS.values():
        assert v.formula and "\n" not in v.formula
        assert len(v.explanation) > 20


def test_nothing_matches_reports_where_it_diverges() -> None:
    q, k, v = inputs(21)
    expected = softmax(q @ T(k) / math.sqrt(D)) @ v
    expected[3, 1] += 0.5  # one wrong cell
    problem = Problem.build(q, k, v, query_labels=list("abcde"))
    verdict = check(problem, expected, tolerance=TOL)
    assert verdict.explanations == [] and verdict.nearest == []  # no variant comes 4× closer than no change
    assert verdict.divergence is not None
    assert verdict.divergence.rows[0] == ("d", pytest.approx(0.5))
    assert verdict.divergence.columns[0] == ("d1", pytest.approx(0.5))
    assert verdict.comparison.first[0].label == "[d, d1]"


# ---- multi-head ---------------------------------------------------------------------------------

B, TOK, DM = 2, 5, 8  # batch, tokens, model width (d_k = d_v = d_out = 8)


def mha_by_hand(x: np.ndarray, w: dict[str, np.ndarray], heads: int, *, scale_width: int | None = None,
                transpose: bool = True, order: tuple[int, ...] | None = None, out_proj: bool = True,
                after_softmax: bool = False) -> np.ndarray:
    """Multi-head attention written out head by head (float64), with the mistakes as switches."""
    q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]  # (B, T, D) x (D, d) -> (B, T, d)
    dh = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        width = scale_width or dh
        s = q[..., sl] @ T(k[..., sl])
        o = softmax(s) @ v[..., sl] / math.sqrt(width) if after_softmax else softmax(s / math.sqrt(width)) @ v[..., sl]
        outs.append(o)  # (B, T, dh)
    if transpose:
        concat = np.concatenate([outs[i] for i in (order or range(heads))], axis=-1)  # (B, T, d)
    else:
        concat = np.stack(outs, axis=1).reshape(x.shape[0], x.shape[1], -1)  # (B, H, T, dh) read as (B, T, d)
    return concat @ w["W_o"] + w["b_o"] if out_proj else concat


def mh_named(expected: np.ndarray, w: dict[str, np.ndarray], x: np.ndarray, heads: int) -> set[str]:
    from attncli.core.layer import Layer
    from attncli.core.projections import Projections

    setup = Layer.build(x, projections=Projections(**w), heads=heads)
    verdict = check(setup, expected, tolerance=TOL)
    assert not verdict.match
    return {e.name for e in verdict.explanations}


def mh_inputs(seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = {n: rng.normal(size=(DM, DM)) / math.sqrt(DM) for n in ("W_q", "W_k", "W_v", "W_o")}
    w["b_o"] = rng.normal(size=DM)
    return rng.normal(size=(B, TOK, DM)), w


def test_multihead_reference_matches_the_module() -> None:
    # sanity: the hand-written reference is what attncli computes (else the cases below prove nothing)
    from attncli.core.layer import Layer
    from attncli.core.projections import Projections

    x, w = mh_inputs(30)
    assert check(Layer.build(x, projections=Projections(**w), heads=2), mha_by_hand(x, w, 2), tolerance=TOL).match


@pytest.mark.parametrize("case,kw,heads", [
    ({"sqrt-model-width"}, {"scale_width": DM}, 2),
    ({"heads-not-transposed"}, {"transpose": False}, 2),
    ({"heads-wrong-order"}, {"order": (1, 0)}, 2),
    ({"heads-wrong-order"}, {"order": (2, 0, 1, 3)}, 4),
    ({"output-projection-missing"}, {"out_proj": False}, 2),
    ({"scale-after-softmax"}, {"after_softmax": True}, 2),
])
def test_multihead_variants_are_named(case: set[str], kw: dict[str, object], heads: int) -> None:
    x, w = mh_inputs(31 + heads)
    assert mh_named(mha_by_hand(x, w, heads, **kw), w, x, heads) == case  # type: ignore[arg-type]


def test_multihead_q_k_swapped() -> None:
    x, w = mh_inputs(45)
    swapped = {**w, "W_q": w["W_k"], "W_k": w["W_q"]}  # K Qᵀ in every head
    assert mh_named(mha_by_hand(x, swapped, 2), w, x, 2) == {"q-k-swapped"}


def test_multihead_key_padding_mask_inverted() -> None:
    from attncli.core.layer import Layer
    from attncli.core.projections import Projections

    x, w = mh_inputs(46)
    pad = np.zeros((B, TOK), dtype=bool)
    pad[0, 3:] = pad[1, 1:3] = True  # True = ignore that key (PyTorch)
    # by hand: two heads of width 4, keys kept where pad is True (the inverted meaning)
    q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]
    heads = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        s = np.where(pad[:, None, :], q[..., sl] @ T(k[..., sl]) / 2.0, -np.inf)  # (B, T, T), √4 = 2
        heads.append(softmax(s) @ v[..., sl])
    expected = np.concatenate(heads, axis=-1) @ w["W_o"] + w["b_o"]
    verdict = check(Layer.build(x, projections=Projections(**w), heads=2, padding=pad), expected, tolerance=TOL)
    assert {e.name for e in verdict.explanations} == {"mask-inverted"}


def test_wrong_head_order_is_spelled_out() -> None:
    from attncli.core.layer import Layer
    from attncli.core.projections import Projections

    x, w = mh_inputs(40)
    verdict = check(Layer.build(x, projections=Projections(**w), heads=2), mha_by_hand(x, w, 2, order=(1, 0)), tolerance=TOL)
    assert "head 1, head 0 instead of head 0, head 1" in verdict.explanations[0].explanation


# ---- additive: activation missing -----------------------------------------------------------------

def test_additive_activation_missing() -> None:
    from attncli.core.scoring import SCORES

    if "additive" not in SCORES:
        pytest.skip("the additive score (issue 3) is not registered")
    rng = np.random.default_rng(50)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 2)), rng.normal(size=(5, 3))
    h = 6
    params = {"W_q": rng.normal(size=(4, h)), "W_k": rng.normal(size=(2, h)), "w_v": rng.normal(size=h)}
    # w_vᵀ (W_q q + W_k k), without tanh: (m, 1, h) + (1, n, h) -> (m, n, h) -> (m, n)
    s = (q @ params["W_q"])[:, None, :] + (k @ params["W_k"])[None, :, :]
    expected = softmax(s @ params["w_v"]) @ v
    problem = Problem.build(q, k, v, score_weights=params, options=Options(score="additive"))
    verdict = check(problem, expected, tolerance=TOL)
    assert {e.name for e in verdict.explanations} == {"activation-missing"}
