"""No false alarm from ``check`` on any family's own layer, and a 2% wrong head named (issue 24).

For each family of the checkpoint sweep (tests/test_families.py: the same tiny random models, the same weights)
the model is run in float32, bfloat16 and float16 (module and checkpoint in that dtype, ``save_pretrained``).
Hooks capture the tested layers' attention input, the output projection's input (the concatenated heads) and
its output. The reference is transformers' own module:

- its output, checked against the checkpoint layer with default options, from the module's input and with
  ``--from-residual`` from ``hidden_states[i]``, must be MATCH (exit 0);
- the output with head ``BAD_HEAD`` 2% off (that head's slice of the projection's input scaled by 1.02, the
  projection applied by the test in the same dtype) must be MISMATCH (exit 1) naming that head.

``FALSE_ALARMS`` lists the (family, dtype) pairs where ``check`` is wrong today, with the cause, as strict xfail.
``python tests/test_check_families.py`` prints the table of docs/false_alarms.md.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
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

from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_families import Skip, T, _attention, _config, _layers, _mappings, _randomise, _tested_layers  # noqa: E402

runner = CliRunner()
BAD_HEAD = 1
DTYPES = ("float32", "bfloat16", "float16")
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt_oss", "gpt2", "gpt_neox",
            "gptj", "bloom", "bert", "granite", "cohere2", "phi3", "starcoder2", "smollm3"]
# (family, dtype) -> why check raises a false alarm (or misses the head) there today.
_UNNAMED = ("bfloat16, head 1 x1.02: MISMATCH by the overall rule but no head named (precision.heads_over empty): "
            "the per-head rules do not see a 2% head error above bfloat16 rounding in this family")
FALSE_ALARMS: dict[tuple[str, str], str] = {
    ("qwen2", "bfloat16"): "missed: head 1 x1.02 is a MATCH (largest error 0.076 within the bfloat16 bound 0.11)",
    **{(mt, "bfloat16"): _UNNAMED for mt in ("qwen3", "gemma2", "gptj", "bloom", "phi3", "starcoder2", "gpt_oss")},
}


@functools.cache
def _model(mt: str) -> tuple[Any, Any, dict[int, str]]:
    """The family's tiny model with the sweep's random weights (float32), its config and its tested layers."""
    causal, _ = _mappings()
    cfg = _config(mt, 0)
    auto = transformers.AutoModelForCausalLM if mt in causal else transformers.AutoModelForMaskedLM
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = auto.from_config(cfg, attn_implementation="eager").eval()
    _randomise(model, 0)
    stack = _layers(model, cfg.num_hidden_layers)
    found = [i for i, layer in enumerate(stack) if _attention(layer) is not None]
    return model, cfg, _tested_layers(cfg, found)


@dataclass
class Layer:
    x: Any  # the attention module's input (T, E)
    h: Any  # the residual entering the layer, hidden_states[i] (T, E)
    z: Any  # the output projection's input: the heads concatenated (T, H·d)
    y: Any  # the module's output (T, E), in the dtype
    proj: Any  # the output projection


def run_family(mt: str, dtype: Any, folder: Path) -> dict[int, Layer]:
    base, cfg, tested = _model(mt)
    model = copy.deepcopy(base).to(dtype)
    model.save_pretrained(folder)
    stack = _layers(model, cfg.num_hidden_layers)
    got: dict[int, dict[str, Any]] = {i: {} for i in tested}
    handles = []
    for i in tested:
        attn, out = _attention(stack[i])

        def pre(m: Any, args: Any, kw: Any, g: dict[str, Any] = got[i]) -> None:
            g.setdefault("x", (args[0] if args else kw["hidden_states"]).detach()[0])

        def zin(m: Any, args: Any, g: dict[str, Any] = got[i]) -> None:
            g.setdefault("z", args[0].detach()[0])

        def yout(m: Any, args: Any, res: Any, g: dict[str, Any] = got[i], o: Any = out) -> None:
            g.setdefault("y", res.detach()[0])
            g["proj"] = o

        handles += [attn.register_forward_pre_hook(pre, with_kwargs=True), out.register_forward_pre_hook(zin),
                    out.register_forward_hook(yout)]
    ids = (torch.arange(T) * 7 + 3).remainder(60)[None] + 3
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = model(input_ids=ids, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    return {i: Layer(h=res.hidden_states[i][0], **g) for i, g in got.items()}


def check(folder: Path, layer: int, x: Any, y: Any, work: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    np.save(work / "x.npy", x.float().numpy())  # exact: every dtype here widens to float32
    torch.save(y.clone(), work / "y.pt")
    r = runner.invoke(app, ["check", str(work / "y.pt"), str(work / "x.npy"), "--weights", str(folder),
                            "--layer", str(layer), "--format", "json", *extra])
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
    detail: str = ""


def sweep(mt: str, dtype_name: str) -> Row:
    dtype = getattr(torch, dtype_name)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            layers = run_family(mt, dtype, work / "model")
        except Skip:
            raise
        except Exception as e:  # noqa: BLE001 - a module that cannot run in this dtype on CPU
            raise Skip("dtype", f"{mt} does not run in {dtype_name} on CPU: {type(e).__name__}: {str(e)[:120]}") \
                from e
        verdicts, errors, bounds, details = [], [], [], []
        for (i, lay), residual in itertools.product(layers.items(), (False, True)):
            extra = ("--from-residual",) if residual else ()
            code, doc = check(work / "model", i, lay.h if residual else lay.x, lay.y, work, *extra)
            verdicts.append("MATCH" if code == 0 else "false alarm")
            errors.append(doc["max_abs_error"])
            bounds.append(doc["tolerance"]["atol"])
            if code:
                p = doc["precision"] or {}
                details.append(f"layer {i}{' --from-residual' * residual}: {doc['rule']} rule, largest error "
                               f"{doc['max_abs_error']:.2g} (bound {doc['tolerance']['atol']:.2g}), rows over "
                               f"{[r['label'] for r in p.get('rows_over', [])]}, heads over "
                               f"{[(h['label'], h['ratio']) for h in p.get('heads_over', [])]}")
        i, lay = max(layers.items())
        heads = _model(mt)[1].num_attention_heads
        code, doc = check(work / "model", i, lay.x, perturbed(lay, heads), work)
        over = (doc.get("precision") or {}).get("heads_over") or []
        if code == 0:
            named = "missed (MATCH)"
        elif over and over[0]["label"] == f"head {BAD_HEAD}":
            named = "MISMATCH-named"
        else:
            named = "MISMATCH, head not named"
            details.append(f"perturbed layer {i}: heads over {[h['label'] for h in over]}")
        return Row(verdicts, named, max(errors), min(bounds), "; ".join(details))


def _params() -> list[Any]:
    out = []
    for mt in FAMILIES:
        for dt in DTYPES:
            marks = [pytest.mark.xfail(reason=FALSE_ALARMS[mt, dt], strict=True)] if (mt, dt) in FALSE_ALARMS else []
            out.append(pytest.param(mt, dt, id=f"{mt}-{dt}", marks=marks))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("mt", "dtype"), _params())
def test_own_output_matches_and_a_2_percent_head_is_named(mt: str, dtype: str) -> None:
    try:
        row = sweep(mt, dtype)
    except Skip as e:
        pytest.skip(f"{e.why}: {e.detail}")
    assert row.verdicts and all(v == "MATCH" for v in row.verdicts), f"false alarm: {row.detail}"
    assert row.named == "MISMATCH-named", row.detail


def main() -> None:  # python tests/test_check_families.py [families...]: the table of docs/false_alarms.md
    print("| family | dtype | own output | largest error | bound | head 1 ×1.02 | note |")
    print("|---|---|---|---|---|---|---|")
    for mt in sys.argv[1:] or FAMILIES:
        for dt in DTYPES:
            try:
                r = sweep(mt, dt)
            except Skip as e:
                print(f"| {mt} | {dt} | skipped | | | | {e.detail} |", flush=True)
                continue
            own = "MATCH" if all(v == "MATCH" for v in r.verdicts) else "false alarm"
            print(f"| {mt} | {dt} | {own} ({len(r.verdicts)} checks) | {r.error:.2g} "
                  f"| {r.bound:.2g} | {r.named} | {r.detail} |", flush=True)


if __name__ == "__main__":
    main()
