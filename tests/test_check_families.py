"""No false alarm from ``check`` on any family's own layer, and a 2% wrong head named (issue 24).

For every family attncli reads that the checkpoint sweep builds (:func:`families`: attncli.io.families.FAMILIES
intersected with tests/test_families.py's model types, the same tiny random models and weights, seed
``ATTNCLI_SWEEP_SEED``, default 0) the model is run in float32, bfloat16 and float16 (module and checkpoint in that
dtype, ``save_pretrained``; RoPE's ``inv_freq`` kept in float32, as ``from_pretrained(dtype=...)`` loads it).
Hooks capture the tested layers' attention input, the output projection's input (the concatenated heads) and its
output. The reference is transformers' own module:

- its output, checked against the checkpoint layer with default options, from the module's input and with
  ``--from-residual`` from ``hidden_states[i]``, must be MATCH (exit 0);
- the output of the last tested layer with head ``BAD_HEAD`` 2% off (that head's slice of the projection's input
  scaled by 1.02, the projection applied by the test in the same dtype) must be MISMATCH (exit 1) naming that head
  first in ``precision.heads_over`` (checked with ``--no-search``: the catalogue is not what is tested here).

Every family runs by default (the whole slow test: 375 cases, about 2 minutes on two cores; ``ATTNCLI_SWEEP_ONLY=a,b``
picks some). ``FALSE_ALARMS`` lists the (family, dtype) pairs where ``check`` is wrong at seed 0, with the cause, as
strict xfails (none at seeds 0-5; another seed may fail or pass elsewhere: say so when you change it), and
``LATER_SEEDS`` the false alarms other seeds found, each fixed and run here at its seed.
``python tests/test_check_families.py [families...]`` prints the table of docs/false_alarms.md.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from halfbounds import assert_rounds_as  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402
from attncli.io.families import FAMILIES  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_families import (  # noqa: E402
    SEED,
    SHARED,
    Skip,
    T,
    _attention,
    _layers,
    _shared,
    _tested_layers,
    _x_module,
    model_types,
    tiny_model,
)

runner = CliRunner()
BAD_HEAD = 1
DTYPES = ("float32", "bfloat16", "float16")


def families() -> list[str]:
    """Every family attncli declares (attncli.io.families.FAMILIES) that the checkpoint sweep builds from a tiny
    config (tests/test_families.py's model types; ``ATTNCLI_SWEEP_ONLY=a,b`` restricts them). A family transformers
    does not build, or whose tiny layer ``check`` refuses in one line (its config uses a key attncli does not read),
    is skipped with the reason: those are the families sweep's "skipped" and "refused" rows."""
    return sorted(set(FAMILIES) & set(model_types()))


def documented_skips() -> dict[tuple[str, str], str]:
    """docs/false_alarms.md's skipped rows (this file's main() prints them): (family, dtype) -> the reason, which
    starts with the Skip's kind ("refused": attncli refuses the tiny layer in one line, as the families sweep says)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "false_alarms.md").read_text()
    rows = re.findall(r"^\| ([^ |]+) \| ([a-z0-9]+) \| skipped \|(?: *\|){7} (.*) \|$", doc, flags=re.M)
    return {(mt, dt): why for mt, dt, why in rows}


DOCUMENTED_SKIPS = documented_skips()

# (family, dtype) -> why check raises a false alarm (or misses the head) there today, at seed 0: none since the plain
# emulation rounds RoPE's cos/sin to the dtype and computes norms in float32 as transformers does (attncli.check.precision)
FALSE_ALARMS: dict[tuple[str, str], str] = {}


@functools.cache
def _model(mt: str, seed: int = SEED) -> tuple[Any, Any, dict[int, str]]:
    """The family's tiny model with the sweep's random weights (float32), its config and its tested layers."""
    model, cfg = tiny_model(mt, seed)
    if mt in SHARED:  # the layers share their attention modules (ALBERT): the tested calls are chosen in run_family
        return model, cfg, {}
    stack = _layers(model, cfg.num_hidden_layers)
    found = [i for i, layer in enumerate(stack) if _attention(layer) is not None]
    if not found:
        raise Skip("no-attention", "no *Attention module with an output projection in its layers")
    return model, cfg, _tested_layers(cfg, found)


@dataclass
class Layer:
    x: Any  # the attention module's input (T, E)
    h: Any  # the residual entering the layer, hidden_states[i] (T, E)
    z: Any  # the output projection's input: the heads concatenated (T, H·d)
    y: Any  # the module's output (T, E), in the dtype
    proj: Any  # the output projection
    heads: int  # the module's query heads (its head_dim divides z's width; else the config's num_attention_heads)


def run_family(mt: str, dtype: Any, folder: Path, seed: int = SEED) -> dict[int, Layer]:
    base, cfg, tested = _model(mt, seed)
    model = copy.deepcopy(base).to(dtype)
    for name, buf in base.named_buffers():  # RoPE's frequencies stay float32, as from_pretrained(dtype=...) leaves them
        if "inv_freq" in name:  # (.to(dtype) rounds them: θ off by up to 2⁻⁹·position, not the plain implementation)
            owner, leaf = name.rpartition(".")[::2]
            setattr(model.get_submodule(owner), leaf, buf.clone())
    model.save_pretrained(folder)
    if mt in SHARED:  # ALBERT: call c of its shared attention modules is layer c (hidden_states[c] its residual)
        calls: list[dict[str, Any]] = []
        mods = _shared(model)
        tested = {}
    else:
        stack = _layers(model, cfg.num_hidden_layers)
        mods = [_attention(stack[i]) for i in tested]
    got: dict[int, dict[str, Any]] = {i: {} for i in tested}
    handles = []
    for attn, out in (mods if mt in SHARED else []):
        def pre_c(m: Any, args: Any, kw: Any, c: list[dict[str, Any]] = calls) -> None:
            c.append({"x": (args[0] if args else kw["hidden_states"]).detach()[0]})

        def zin_c(m: Any, args: Any, c: list[dict[str, Any]] = calls) -> None:
            c[-1].setdefault("z", args[0].detach()[0])

        def yout_c(m: Any, args: Any, res: Any, c: list[dict[str, Any]] = calls, o: Any = out) -> None:
            c[-1].setdefault("y", res.detach()[0])
            c[-1] |= {"proj": o, "heads": cfg.num_attention_heads}

        handles += [attn.register_forward_pre_hook(pre_c, with_kwargs=True), out.register_forward_pre_hook(zin_c),
                    out.register_forward_hook(yout_c)]
    for i, (attn, out) in zip(tested, mods if mt not in SHARED else []):

        def pre(m: Any, args: Any, kw: Any, g: dict[str, Any] = got[i]) -> None:
            g.setdefault("x", (args[0] if args else kw["hidden_states"]).detach()[0])

        def zin(m: Any, args: Any, g: dict[str, Any] = got[i]) -> None:
            g.setdefault("z", args[0].detach()[0])

        def yout(m: Any, args: Any, res: Any, g: dict[str, Any] = got[i], o: Any = out, a: Any = attn) -> None:
            g.setdefault("y", res.detach()[0])
            g["proj"] = o
            d = getattr(a, "head_dim", None)  # whisper's decoder: 4 heads where num_attention_heads (the encoder's) is 2
            g["heads"] = g["z"].shape[-1] // d if isinstance(d, int) and d > 0 else cfg.num_attention_heads

        handles += [_x_module(attn).register_forward_pre_hook(pre, with_kwargs=True), out.register_forward_pre_hook(zin),
                    out.register_forward_hook(yout)]
    ids = (torch.arange(T) * 7 + 3).remainder(60)[None] + 3
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = model(input_ids=ids, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    if mt in SHARED:  # call 2 and the last, as the families sweep (call 0 takes the embeddings' projection)
        got = {i: calls[i] for i in sorted({min(2, len(calls) - 1), len(calls) - 1})}
    return {i: Layer(h=res.hidden_states[i][0], **g) for i, g in got.items()}


def check(folder: Path, layer: int, x: Any, y: Any, work: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """``attncli check Y.pt X.npy --weights FOLDER --layer N --format json``: (exit code, the report); on a
    refusal (exit 2) the report is {"refused": its one line}."""
    np.save(work / "x.npy", x.float().numpy())  # exact: every dtype here widens to float32
    torch.save(y.clone(), work / "y.pt")
    r = runner.invoke(app, ["check", str(work / "y.pt"), str(work / "x.npy"), "--weights", str(folder),
                            "--layer", str(layer), "--format", "json", *extra])
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr[-300:]
        return 2, {"refused": lines[0]}
    assert r.exit_code in (0, 1), (r.exit_code, r.stderr[-300:])
    return r.exit_code, json.loads(r.stdout)


def perturbed(lay: Layer, heads: int) -> Any:
    z = lay.z.clone()
    d = z.shape[-1] // heads
    z[..., BAD_HEAD * d:(BAD_HEAD + 1) * d] *= 1.02  # head BAD_HEAD's output, 2% off
    with torch.no_grad():
        return lay.proj(z[None])[0]


@dataclass
class Row:
    verdicts: list[str]  # per tested layer, from its input and --from-residual: "MATCH" / "false alarm"
    named: str  # "MISMATCH-named" / "MISMATCH, head not named" / "missed (MATCH)"
    error: float  # the largest error of the module's own output
    bound: float
    own_z: float  # the largest |α|/σ of any head of the module's own output (a head is named above SCALED_HEAD_Z)
    bad_scale: float  # head BAD_HEAD's fitted scale 1 + α in the perturbed output (1.02 planted)
    bad_z: float  # ...and its |α|/σ
    ratio: float = math.nan  # the largest, over the checks of the own output, of its largest error / plain's
    detail: str = ""


def _fit(doc: dict[str, Any], label: str | None = None) -> tuple[float, float]:
    """(scale, |α|/σ) of head ``label`` in the report's head fits, or the largest |α|/σ of any head (nan: none)."""
    fits = (doc.get("precision") or {}).get("head_fits") or []
    if label is not None:
        fits = [f for f in fits if f["label"] == label]
    if not fits:
        return math.nan, math.nan
    f = max(fits, key=lambda f: f["ratio"])
    return f["scale"], f["ratio"]


def sweep(mt: str, dtype_name: str, seed: int = SEED) -> Row:
    dtype = getattr(torch, dtype_name)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            layers = run_family(mt, dtype, work / "model", seed)
        except Skip:
            raise
        except Exception as e:  # noqa: BLE001 - a module that cannot run in this dtype on CPU
            raise Skip("dtype", f"{mt} does not run in {dtype_name} on CPU: {type(e).__name__}: {str(e)[:120]}") \
                from e
        verdicts, errors, bounds, details, own_z, read, refused, ratios = [], [], [], [], [], [], [], []
        for (i, lay), residual in itertools.product(layers.items(), (False, True)):
            extra = ("--from-residual",) if residual else ()
            code, doc = check(work / "model", i, lay.h if residual else lay.x, lay.y, work, *extra)
            if code == 2:  # a layer attncli does not read (the families sweep's refusals): one line, nothing judged
                refused.append(f"layer {i}: {doc['refused'].removeprefix('attncli: error: ').replace(str(work), 'FOLDER')}")
                continue
            read.append(i)
            verdicts.append("MATCH" if code == 0 else "false alarm")
            errors.append(doc["max_abs_error"])
            bounds.append(doc["tolerance"]["atol"])
            own_z.append(_fit(doc)[1])
            ratios.append((doc.get("precision") or {}).get("ratio") or math.nan)
            if code:
                p = doc["precision"] or {}
                details.append(f"layer {i}{' --from-residual' * residual}: {doc['rule']} rule, largest error "
                               f"{doc['max_abs_error']:.2g} (bound {doc['tolerance']['atol']:.2g}), rows over "
                               f"{[r['label'] for r in p.get('rows_over', [])]}, heads over "
                               f"{[(h['label'], h['ratio']) for h in p.get('heads_over', [])]}")
        if not read:
            raise Skip("refused", refused[0])
        refused = list(dict.fromkeys(refused))  # from the input and from the residual: one line
        i = max(read)
        bad = perturbed(layers[i], layers[i].heads)
        code, doc = check(work / "model", i, layers[i].x, bad, work, "--no-search")
        over = (doc.get("precision") or {}).get("heads_over") or []
        if code == 0:
            named = "missed (MATCH)"
        elif over and over[0]["label"] == f"head {BAD_HEAD}":
            named = "MISMATCH-named"
        else:
            named = "MISMATCH, head not named"
            details.append(f"perturbed layer {i}: heads over {[h['label'] for h in over]}")
        details += refused
        scale, z = _fit(doc, f"head {BAD_HEAD}")
        return Row(verdicts, named, max(errors), min(bounds), max(own_z), scale, z, max(ratios), "; ".join(details))


def _params() -> list[Any]:
    out = []
    for mt in families():
        for dt in DTYPES:
            marks = [pytest.mark.xfail(reason=FALSE_ALARMS[mt, dt], strict=True)] if (mt, dt) in FALSE_ALARMS else []
            out.append(pytest.param(mt, dt, id=f"{mt}-{dt}", marks=marks))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("mt", "dtype"), _params())
def test_own_output_matches_and_a_2_percent_head_is_named(mt: str, dtype: str) -> None:
    try:
        row = sweep(mt, dtype)
    except Skip as e:  # only where docs/false_alarms.md skips it, for the same reason; else the harness failed
        why = DOCUMENTED_SKIPS.get((mt, dtype))
        if why is None or why.split(":")[0] != e.why:
            pytest.fail(f"{mt} {dtype}: the harness skipped it ({e.why}: {e.detail}); docs/false_alarms.md: {why}")
        pytest.skip(f"{e.why}: {e.detail}")
    assert row.verdicts and all(v == "MATCH" for v in row.verdicts), f"false alarm: {row.detail}"
    assert row.named == "MISMATCH-named", row.detail


# the false alarms the sweep found at later seeds (docs/false_alarms.md), each with what it was: fixed, checked here
LATER_SEEDS = [
    ("gpt_oss", "float16", 3),  # 2.04× plain's largest error: F.linear's bias, GPT-OSS's RMSNorm, the softmax rounding
    ("helium", "float16", 3),  # 2.19×: the same three (its RMSNorm applies w in float32)
    ("deepseek_v2", "float32", 3),  # per-head rule 4.1× in three heads: W_o's gain under 1e-3 in one direction
    ("cohere2", "float32", 4),  # per-head rule 3.6× in two heads: the same
]


@pytest.mark.parametrize(("mt", "dtype", "seed"), LATER_SEEDS, ids=[f"{m}-{d}-seed{s}" for m, d, s in LATER_SEEDS])
def test_the_false_alarms_of_later_seeds(mt: str, dtype: str, seed: int) -> None:
    row = sweep(mt, dtype, seed)
    assert row.verdicts and all(v == "MATCH" for v in row.verdicts), f"false alarm: {row.detail}"
    assert row.named == "MISMATCH-named", row.detail


def _norm_modules(model: Any, mt: str) -> list[tuple[str, Any, bool]]:
    """The RMSNorms of the family's first attention layer that attncli computes (the pre-norm, the QK-norm, the
    sub-norm), each with whether its weight is (1 + w)."""
    f = FAMILIES[mt]
    ends = {f.norm_name: f.pre_norm, f.qk_names[0]: f.qk_norm} | ({f.sub_norm: "rms"} if f.sub_norm else {})
    out = []
    for name, m in model.named_modules():
        kind = next((k for e, k in ends.items() if name.endswith("." + e)), None)
        w = getattr(m, "weight", None)
        if kind in ("rms", "rms1p", "rms-full") and isinstance(w, torch.Tensor) and w.ndim == 1 and ".0." in name:
            out.append((name, m, kind == "rms1p"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mt", families())
def test_each_familys_rms_norms_round_as_declared(mt: str) -> None:
    # the family fact rms_wide (attncli.io.families) against transformers' own RMSNorm modules in float16: Llama's
    # rounds x / rms(x) to the dtype, then times w; GPT-OSS's, Helium's, OLMo 2's and AFMoE's multiply by w in
    # float32 and round once. The plain emulation (attncli.check.precision) computes the family's, and not the
    # other (a wrong fact moved the emulation's error and gave the float16 false alarms of seed 3)
    from attncli.check.precision import RoundingNamespace, rounded
    from attncli.core import ops

    try:
        model, _ = tiny_model(mt, SEED)
    except Skip as e:
        pytest.skip(f"{e.why}: {e.detail}")
    found = _norm_modules(model, mt)
    if not found:
        pytest.skip(f"{mt}: no RMSNorm with a weight before or inside its attention")
    xp, wide = RoundingNamespace("float16"), FAMILIES[mt].rms_wide
    g = torch.Generator().manual_seed(SEED)
    for name, m, plus_one in found:
        m = copy.deepcopy(m).to(torch.float16)
        d = int(m.weight.shape[0])
        with torch.no_grad():
            m.weight.copy_((torch.rand(d, generator=g) * 3 + 0.2 - (1.0 if plus_one else 0.0)).half())
            x = (torch.randn(2, 5, d, generator=g) * 3).half()
            y = m(x).double().numpy()
        eps = float(getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6)))
        xs, ws = rounded(x.double().numpy(), "float16"), rounded(m.weight.detach().double().numpy(), "float16")
        ours = np.asarray(ops.rms_norm(xp, xs, ws, eps, plus_one=plus_one, wide_weight=wide), dtype=np.float64)
        others = []
        if not plus_one:  # the other reading is measurably not the module's
            others = [("the other RMSNorm", np.asarray(ops.rms_norm(xp, xs, ws, eps, wide_weight=not wide),
                                                        dtype=np.float64))]
        assert_rounds_as(ours, y, "float16", others=others, what=f"{mt} {name}")  # tests/halfbounds.py


def main() -> None:  # python tests/test_check_families.py [families...]: the table of docs/false_alarms.md
    print("| family | dtype | own output | largest error | bound | ÷ plain's | own: largest head |α|/σ | head 1 ×1.02 "
          "| its fitted scale | its |α|/σ | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mt in sys.argv[1:] or families():
        for dt in DTYPES:
            try:
                r = sweep(mt, dt)
            except Skip as e:
                print(f"| {mt} | {dt} | skipped | | | | | | | | {e.why}: {e.detail} |", flush=True)
                continue
            own = "MATCH" if all(v == "MATCH" for v in r.verdicts) else "false alarm"
            print(f"| {mt} | {dt} | {own} ({len(r.verdicts)} checks) | {r.error:.2g} | {r.bound:.2g} | {r.ratio:.2f} "
                  f"| {r.own_z:.2g} | {r.named} | {r.bad_scale:.4f} | {r.bad_z:.3g} | {r.detail} |", flush=True)


if __name__ == "__main__":
    main()


def test_head_scales_are_the_least_squares_fit_of_the_output_error() -> None:
    """attncli.check.verdict.head_scales against numpy's lstsq on the explicit (cells, H) matrix of the heads'
    contributions o_h · W_o[h] (built by a plain loop), and the cluster-robust standard error (clusters: rows)
    written out as the textbook sandwich with a loop over rows."""
    from attncli.check.verdict import head_scales

    rng = np.random.default_rng(0)
    B, Tq, H, d, E = 2, 7, 3, 4, 10
    concat = rng.normal(size=(B, Tq, H * d))
    w_o = rng.normal(size=(H * d, E))
    contrib = np.zeros((B * Tq * E, H))
    for h in range(H):
        contrib[:, h] = (concat[..., h * d:(h + 1) * d] @ w_o[h * d:(h + 1) * d]).ravel()
    alpha = np.array([0.0, 0.02, -0.01])
    diff = (contrib @ alpha).reshape(B, Tq, E) + 1e-3 * rng.normal(size=(B, Tq, E))
    fit = head_scales({"W_o": w_o, "concat": concat, "head_output": np.zeros((B, H, Tq, d))}, diff)  # type: ignore[arg-type]
    assert fit is not None
    want, *_ = np.linalg.lstsq(contrib, diff.ravel(), rcond=None)
    res = diff.ravel() - contrib @ want
    bread = np.linalg.inv(contrib.T @ contrib)
    meat = np.zeros((H, H))
    for g in range(B * Tq):  # cells g*E .. (g+1)*E - 1 are row g
        u = contrib[g * E:(g + 1) * E].T @ res[g * E:(g + 1) * E]
        meat += np.outer(u, u)
    se = np.sqrt(np.diag(bread @ meat @ bread) * (B * Tq) / (B * Tq - 1))
    np.testing.assert_allclose(fit.alpha, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fit.se, se, rtol=1e-6)
    assert np.all(np.abs(fit.alpha - alpha) < 5 * se)  # the planted scales, within the noise
