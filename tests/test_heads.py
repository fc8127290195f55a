"""attncli heads: every statistic against a float64 computation from the model's own eager attention weights.

The reference (:func:`reference`) is a plain loop over the weights transformers returns with
``output_attentions=True`` (attn_implementation="eager", the model cast to float64): it knows nothing of
attncli's blocks, chain or softmax. The statistics' definitions are issue 33's.
"""

from __future__ import annotations

import unicodedata
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attncli.core import engine  # noqa: E402
from attncli.core import headstats as hs  # noqa: E402
from attncli.core.backend import get_backend  # noqa: E402
from attncli.core.options import Options  # noqa: E402
from attncli.io.model import load_layer  # noqa: E402

V = 40  # vocabulary
SPECIAL = {0, 1}  # token ids taken as special ([CLS]/<s>, [SEP]/</s>)
PUNCT = {2: ".", 3: ",", 4: "!?"}  # token ids whose labels are punctuation


def label(t: int) -> str:
    return PUNCT.get(t, " w" + str(t))


def tiny(kind: str, seed: int = 0) -> Any:
    """A tiny random model of ``kind`` (eager attention, float64, eval)."""
    common = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
    if kind == "llama":  # causal, grouped-query (2 K/V heads for 4 query heads)
        cfg = transformers.LlamaConfig(intermediate_size=64, num_key_value_heads=2, **common)
    elif kind == "mistral":  # causal, a sliding window of 4
        cfg = transformers.MistralConfig(intermediate_size=64, num_key_value_heads=4, sliding_window=4, **common)
    elif kind == "bert":  # bidirectional
        cfg = transformers.BertConfig(intermediate_size=64, **common)
    elif kind == "gpt_oss":  # sinks, a sliding layer then a full one
        cfg = transformers.GptOssConfig(intermediate_size=32, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                        num_experts_per_tok=1, sliding_window=4,
                                        layer_types=["sliding_attention", "full_attention"],
                                        **{k: v for k, v in common.items()})
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = transformers.AutoModelForMaskedLM if kind == "bert" else transformers.AutoModelForCausalLM
        model = auto.from_config(cfg, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights large enough that heads differ (std 1.5/sqrt(fan_in))
        for name, p in model.named_parameters():
            if p.ndim == 1 and "sinks" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)
    # gpt-oss's experts multiply in float32 at least (torch's grouped matmul has no float64): its weights are float32
    return (model if kind == "gpt_oss" else model.double()).eval()


def run_model(model: Any, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """hidden_states (L + 1, B, T, E) and attentions (L, B, H, T, T), float64, from the model's own forward."""
    with torch.no_grad():
        out = model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask.astype(np.int64)),
                    output_hidden_states=True, output_attentions=True)
    return (np.stack([h.double().numpy() for h in out.hidden_states]),
            np.stack([a.double().numpy() for a in out.attentions]))


def reference(A: np.ndarray, valid: np.ndarray, ids: np.ndarray | None, special: np.ndarray | None,
              punct: np.ndarray | None, exclude_first: bool = False, exclude_self: bool = False,
              sinks: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sums and counts (H, S) of one input from its weights A (H, T, T), by the definitions, in plain loops."""
    H = A.shape[0]
    idx = list(np.flatnonzero(valid))
    sums, counts = np.zeros((H, hs.S)), np.zeros((H, hs.S), dtype=np.int64)
    I = {n: i for i, n in enumerate(hs.STATS)}  # noqa: E741

    def add(h: int, name: str, v: float) -> None:
        sums[h, I[name]] += v
        counts[h, I[name]] += 1

    for h in range(H):
        seen: dict[int, int] = {}
        for r, i in enumerate(idx):
            row = A[h, i].copy()
            may = row > 0  # the keys this query may attend (masked weights are exactly 0 in float64)
            drop = []
            if exclude_first:
                drop.append(idx[0])
            if exclude_self:
                drop.append(i)
            if drop:
                kept = 1.0 - sum(row[d] for d in set(drop))
                for d in set(drop):
                    row[d], may[d] = 0.0, False
                row = row / kept if kept > 0 else row * 0
            previous_seen = seen.get(int(ids[i])) if ids is not None else None
            if ids is not None:
                seen[int(ids[i])] = i
            if not may.any():
                continue
            pos = {j: k for k, j in enumerate(idx)}
            nz = row[row > 0]
            ent = float(-(nz * np.log(nz)).sum())
            add(h, "entropy", ent)
            if may.sum() >= 2:
                add(h, "entropy_norm", ent / np.log(may.sum()))
            add(h, "first", row[idx[0]])
            add(h, "self", row[i])
            if r > 0:
                add(h, "previous", row[idx[r - 1]])
            if r + 1 < len(idx) and may[idx[r + 1]]:
                add(h, "next", row[idx[r + 1]])
            add(h, "max", row.max())
            add(h, "distance", sum(row[j] * abs(pos[i] - pos[j]) for j in idx))
            if sinks:
                add(h, "sink_share", 1.0 - row.sum())
            if special is not None:
                add(h, "special", row[special].sum())
            if punct is not None:
                add(h, "punctuation", row[punct].sum())
            if previous_seen is not None:
                add(h, "duplicate", row[previous_seen])
                add(h, "induction", row[idx[pos[previous_seen] + 1]])
    return sums, counts


def measured(folder: Path, layer: int, hidden: np.ndarray, valid: np.ndarray, seqs: list[hs.Sequence],
             **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    cl = load_layer(folder, layer)
    hidden = np.where(valid[..., None], hidden, 0.0)  # padding's states are never attended (and may be NaN)
    lay = cl.problem(hidden, from_residual=True, padding=~valid, options=cl.config_options(Options(dtype="float64")))
    return hs.layer_sums(engine.prepare(lay, get_backend("numpy")), seqs, **kw)


# float64 everywhere but RoPE, whose cos/sin tables transformers and attncli build in float32 (as the model does)
TOL = {"llama": 1e-6, "mistral": 1e-6, "gpt_oss": 2e-5, "bert": 1e-10}  # gpt-oss: its own weights in float32

CASES = {  # kind -> (batch of token ids, valid mask): repeated tokens (induction), padding on either side
    "llama": "left",
    "mistral": "right",
    "bert": "right",
    "gpt_oss": "left",
}


def batch(pad: str, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    T = 14
    ids = rng.integers(5, V, size=(2, T))
    ids[:, 7:] = ids[:, :7]  # the second half repeats the first: induction and duplicate have queries
    ids[:, 3] = 2  # a full stop
    ids[:, 0] = 0  # a special first token
    valid = np.ones((2, T), dtype=bool)
    if pad == "left":
        valid[1, :4] = False
    else:
        valid[1, -4:] = False
    return ids, valid


@pytest.fixture(scope="module", params=list(CASES))
def model_case(request: Any, tmp_path_factory: Any) -> Any:
    kind = request.param
    model = tiny(kind)
    folder = tmp_path_factory.mktemp(kind)
    model.save_pretrained(folder)
    ids, valid = batch(CASES[kind])
    hidden, _ = run_model(model, ids, valid)
    return kind, folder, ids, valid, hidden, own_weights(model, ids, valid)


def own_weights(model: Any, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The model's weights (L, B, H, T, T) of each input, from a forward of its valid tokens alone, placed at their
    positions (zero rows and columns at padding): a padded batch's own forward carries NaN from fully masked padding
    rows into the next layer's keys in float64."""
    B, T = ids.shape
    out = None
    for b in range(B):
        keep = np.flatnonzero(valid[b])
        _, att = run_model(model, ids[b:b + 1, keep], np.ones((1, len(keep)), bool))
        if out is None:
            out = np.zeros((att.shape[0], B, att.shape[2], T, T))
        out[:, b][..., keep[:, None], keep[None, :]] = att[:, 0]
    assert out is not None
    return out


def sequences(ids: np.ndarray, valid: np.ndarray) -> list[hs.Sequence]:
    return [hs.Sequence(valid[b], token_ids=ids[b], special=np.isin(ids[b], list(SPECIAL)),
                        punctuation=np.array([hs.is_punctuation(label(int(t))) for t in ids[b]])) for b in range(len(ids))]


@pytest.mark.parametrize("exclude", [(False, False), (True, False), (False, True)])
def test_every_statistic_agrees_with_the_models_own_weights(model_case: Any, exclude: tuple[bool, bool]) -> None:
    kind, folder, ids, valid, hidden, att = model_case
    seqs = sequences(ids, valid)
    tol = TOL[kind] * (50 if any(exclude) and kind != "bert" else 1)  # renormalising after a dropped key near 1
    for layer in range(att.shape[0]):
        sums, counts = measured(folder, layer, hidden[layer], valid, seqs, exclude_first=exclude[0],
                                exclude_self=exclude[1])
        for b in range(len(ids)):
            rs, rc = reference(att[layer, b], valid[b], ids[b], np.isin(ids[b], list(SPECIAL)),
                               np.isin(ids[b], list(PUNCT)), *exclude, sinks=kind == "gpt_oss")
            np.testing.assert_array_equal(counts[b], rc, err_msg=f"{kind} layer {layer} input {b}: counts")
            np.testing.assert_allclose(sums[b], rs, rtol=tol, atol=tol, err_msg=f"{kind} layer {layer} input {b}")


def test_the_window_hides_the_first_token(model_case: Any) -> None:
    """Mistral's window of 4: queries at 4 and later cannot see position 0, so their 'first' is 0 (counted)."""
    kind, folder, ids, valid, hidden, att = model_case
    if kind != "mistral":
        pytest.skip("the sliding-window model only")
    sums, counts = measured(folder, 0, hidden[0][:1, :8], np.ones((1, 8), bool), [hs.Sequence.plain(8)])
    assert counts[0, 0, hs.STATS.index("first")] == 8
    np.testing.assert_allclose(sums[0, :, hs.STATS.index("first")], att[0, 0, :, :4, 0].sum(axis=-1), rtol=1e-6)


def test_punctuation_labels() -> None:
    # Unicode categories P* (unicodedata), without the leading space a byte-level or sentencepiece label carries
    assert hs.is_punctuation(".") and hs.is_punctuation(" ,") and hs.is_punctuation("Ġ...") and hs.is_punctuation("«")
    assert not hs.is_punctuation(" cat") and not hs.is_punctuation("") and not hs.is_punctuation("$")
    assert unicodedata.category("$") == "Sc"


def test_patterns_follow_the_stated_thresholds() -> None:
    lim = hs.thresholds()
    assert lim == {"sink": 0.3, "previous-token": 0.5, "self": 0.5, "induction": 0.4, "broad": 0.9, "focused": 0.9}
    assert hs.patterns({"first": 0.31, "max": 0.5}, lim) == ["sink"]
    assert hs.patterns({"first": 0.29, "induction": None}, lim) == []
    assert hs.patterns({"first": 0.29}, hs.thresholds({"sink": 0.2})) == ["sink"]
    with pytest.raises(Exception, match="sink"):
        hs.thresholds({"sink": 1.5})


def test_merge_of_two_halves_is_the_whole(model_case: Any) -> None:
    kind, folder, ids, valid, hidden, att = model_case
    seqs = sequences(ids, valid)
    whole = hs.Sums.zeros(1, 4)
    whole.add_layer(0, *measured(folder, 0, hidden[0], valid, seqs))
    halves = []
    for b in range(2):
        part = hs.Sums.zeros(1, 4)
        part.add_layer(0, *measured(folder, 0, hidden[0][b:b + 1], valid[b:b + 1], seqs[b:b + 1]))
        halves.append(part)
    merged = halves[0].merged(halves[1])
    for name in ("total", "input_sum", "input_sq"):
        np.testing.assert_allclose(getattr(merged, name), getattr(whole, name), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(merged.count, whole.count)
    np.testing.assert_array_equal(merged.inputs, whole.inputs)
    # the spread across the two inputs, by numpy's own std of their means
    means = [h.mean()[0] for h in halves]
    ok = ~np.isnan(means[0]) & ~np.isnan(means[1])
    np.testing.assert_allclose(merged.spread()[0][ok], np.std(np.stack(means), axis=0)[ok], rtol=1e-9, atol=1e-12)


def test_streaming_equals_the_explicit_path(model_case: Any) -> None:
    """The statistics from blocks of rows equal those of attncli's own explicit weights (the whole (B, H, T, T) map,
    engine.run), to float64 rounding: the same chain and softmax, measured two ways."""
    kind, folder, ids, valid, hidden, att = model_case
    seqs = sequences(ids, valid)
    cl = load_layer(folder, 1)
    x = np.where(valid[..., None], hidden[1], 0.0)
    lay = cl.problem(x, from_residual=True, padding=~valid, options=cl.config_options(Options(dtype="float64")))
    w = np.asarray(engine.run(lay).weights)  # (B, H, T, T)
    sums, counts = hs.layer_sums(engine.prepare(lay, get_backend("numpy")), seqs)
    for b in range(len(ids)):
        rs, rc = reference(np.where(valid[b][:, None] & valid[b][None, :], w[b], 0.0), valid[b], ids[b],
                           np.isin(ids[b], list(SPECIAL)), np.isin(ids[b], list(PUNCT)), sinks=kind == "gpt_oss")
        np.testing.assert_array_equal(counts[b], rc)
        np.testing.assert_allclose(sums[b], rs, rtol=1e-12, atol=1e-12)


def test_rollout_refuses_long_inputs() -> None:
    from attncli.core.problem import Problem

    x = np.random.default_rng(0).standard_normal((1, 1, hs.ROLLOUT_MAX + 1, 4))
    prep = engine.prepare(Problem.build(x, x, x), get_backend("numpy"))
    with pytest.raises(Exception, match="rollout holds a T × T product"):
        hs.mean_weights(prep)


def test_rollout_of_identity_weights_is_the_identity() -> None:
    # Â = 0.5·I + 0.5·I = I, so every R_l = I (Abnar & Zuidema's formula on a trivially known input)
    out = hs.rollout([np.eye(3), np.eye(3)])
    np.testing.assert_array_equal(out, np.stack([np.eye(3)] * 2))


def test_cross_attention_counts_what_needs_no_shared_positions() -> None:
    """Queries and keys of different lengths (cross-attention): entropy, first, max, special against attncli's explicit
    weights of the same problem (engine.run), the positional statistics uncounted (null)."""
    from attncli.core.problem import Problem

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 7, 4))
    pad = np.zeros((2, 1, 1, 7), bool)
    pad[1, ..., 5:] = True
    p = Problem.build(q, k, v, mask=~pad, options=Options(score="scaled-dot"))  # keep-mask: padding dropped
    w = np.asarray(engine.run(p).weights)  # (B, H, m, n)
    special = np.zeros(7, bool)
    special[[0, 3]] = True
    keys = [hs.Sequence(~pad[b, 0, 0], special=special) for b in range(2)]
    sums, counts = hs.layer_sums(engine.prepare(p, get_backend("numpy")), [hs.Sequence.plain(5)] * 2, keys=keys)
    I = {n: i for i, n in enumerate(hs.STATS)}  # noqa: E741
    for b in range(2):
        a = w[b]  # (H, 5, 7)
        nz = np.where(a > 0, a, 1.0)
        np.testing.assert_allclose(sums[b, :, I["entropy"]], -(a * np.log(nz)).sum(axis=(-1, -2)), rtol=1e-12)
        np.testing.assert_allclose(sums[b, :, I["first"]], a[..., 0].sum(-1), rtol=1e-12)
        np.testing.assert_allclose(sums[b, :, I["max"]], a.max(-1).sum(-1), rtol=1e-12)
        np.testing.assert_allclose(sums[b, :, I["special"]], a[..., special].sum(axis=(-1, -2)), rtol=1e-12)
        for name in ("self", "previous", "next", "distance", "induction", "duplicate"):
            assert (counts[b, :, I[name]] == 0).all(), name
        assert (counts[b, :, I["entropy"]] == 5).all()
