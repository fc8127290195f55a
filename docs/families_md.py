"""Rebuild docs/families.md from the sweep's rows and the registry.

    python tests/test_families.py > /tmp/fp32.tsv
    ATTNCLI_SWEEP_BF16=1 python tests/test_families.py $(awk -F'\\t' '$2=="agrees"{print $1}' /tmp/fp32.tsv) > /tmp/bf16.tsv
    python docs/families_md.py /tmp/fp32.tsv /tmp/bf16.tsv

The prose and the specification table of docs/families.md stay as written; its counts, the results table, the
bfloat16 table and the declarations (docs/declarations.py) are replaced.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import declarations  # noqa: E402

DOC = Path(__file__).parent / "families.md"


def rows(path: str) -> list[tuple[str, str, str]]:
    out = []
    for line in Path(path).read_text().splitlines():
        name, verdict, detail = (line.split("\t") + ["", ""])[:3]
        detail = re.sub(r"(attncli: error: )?/tmp/[^/ ]+/model", "FOLDER", detail).replace("|", "\\|")
        out.append((name, verdict, detail[:240]))
    return out


def table(rs: list[tuple[str, str, str]], head: str) -> str:
    lines = [f"| {head} | verdict | detail |", "|---|---|---|"]
    lines += [f"| {n} | {'**' + v.upper() + '**' if v in ('wrong', 'broken', 'harness') else v} | {d} |" for n, v, d in rs]
    return "\n".join(lines) + "\n"


def main() -> None:
    fp32, bf16 = rows(sys.argv[1]), rows(sys.argv[2])
    c = Counter(v for _, v, _ in fp32)
    counts = (f"Counts now (issue 20, after its third session): {c['agrees']} agree, {c['refused']} refused, "
              f"{c['partly refused']} partly refused (an agreeing attention layer beside layers without attention), "
              f"{c['wrong'] + c['broken'] + c['harness']} silently wrong or broken, {c['skipped']} skipped (of {len(fp32)}). "
              "Its second session ended at 71 agree, 80 refused; phase A had 46 agree, 60 refused, 46 silently wrong. "
              "Every refusal with a config.json is decided by the family's declaration (`attncli/io/families.py`): "
              "an undeclared `model_type`, a known family refused with its reason, or an attention key its "
              "declaration does not read.")
    b = Counter(v for _, v, _ in bf16)
    doc = DOC.read_text()
    doc = re.sub(r"^Counts after .*$", counts, doc, count=1, flags=re.M)
    doc = re.sub(r"^Counts now .*$", counts, doc, count=1, flags=re.M)
    results = "## Results\n\n" + table(fp32, "model_type") + "\n"
    doc = re.sub(r"## Results\n.*?(?=## bfloat16)", lambda m: results, doc, flags=re.S)
    bf = ("## bfloat16 (every family that agrees in float32)\n\n"
          "Saved in bfloat16; reference = the same module with its weights rounded to bfloat16, computed in float32\n"
          "(so the tolerance stays 1e-5). Every tensor kind (projections, norms, biases, sinks, gates, latents, relative\n"
          "bias) is converted the same way (`attncli.io.model.numbers`: bfloat16/float8 -> float32, exact). "
          f"{b['agrees']} agree, {b['refused']} refused, {b['partly refused']} partly refused, "
          f"{b['wrong'] + b['broken'] + b['harness']} wrong, {b['skipped']} skipped; the slow test "
          "`test_bfloat16_checkpoint_verdict_is_the_documented_one` asserts the verdicts of its `BF16` list.\n\n"
          + table(bf16, "model_type (bf16)") + "\n")
    doc = re.sub(r"## bfloat16 .*?(?=## Specifications)", lambda m: bf, doc, flags=re.S)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        declarations.main()
    decl = ("## Declarations: what each supported family reads from config.json\n\n"
            "Printed by `python docs/declarations.py` from `attncli.io.families.FAMILIES`. A key of `ATTENTION_KEYS` "
            "that a declaration does not read must hold its neutral value (null, false, 1.0, all-full `layer_types`, "
            "...), else the read is refused naming it. `attncli inspect MODEL` lists each such key of a checkpoint as "
            "used / neutral (ignored) / not supported.\n\n" + buf.getvalue())
    doc = re.sub(r"## Declarations.*\Z", lambda m: decl, doc, flags=re.S)
    DOC.write_text(doc)


if __name__ == "__main__":
    main()
