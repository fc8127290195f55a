"""Rebuild docs/families.md from the sweep's rows and the registry.

    python tests/test_families.py > /tmp/fp32.tsv
    ATTNCLI_SWEEP_BF16=1 python tests/test_families.py $(awk -F'\\t' '$2=="agrees"{print $1}' /tmp/fp32.tsv) > /tmp/bf16.tsv
    python docs/families_md.py /tmp/fp32.tsv /tmp/bf16.tsv

The prose and the specification table of docs/families.md stay as written; its counts, the results table, the
bfloat16 table and the declarations (docs/declarations.py) are replaced. The variants' tables (a family's config
switched: ``VARIANTS`` and ``BF16_VARIANTS`` of tests/test_families.py) are replaced by

    python tests/test_families.py --variants > /tmp/variants.tsv
    ATTNCLI_SWEEP_BF16=1 python tests/test_families.py --variants > /tmp/variants_bf16.tsv
    python docs/families_md.py --variants /tmp/variants.tsv /tmp/variants_bf16.tsv

(alone, or after the two tables above on the same command line).
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
    """The rows ``python tests/test_families.py`` prints: name, verdict, detail (already as the table shows it:
    the model folder as FOLDER, ``|`` escaped, at most 240 characters; ``shown`` there)."""
    out = []
    for line in Path(path).read_text().splitlines():
        name, verdict, detail = (line.split("\t") + ["", ""])[:3]
        out.append((name, verdict, detail))
    return out


def table(rs: list[tuple[str, str, str]], head: str) -> str:
    lines = [f"| {head} | verdict | detail |", "|---|---|---|"]
    lines += [f"| {n} | {'**' + v.upper() + '**' if v in ('wrong', 'broken', 'harness') else v} | {d} |" for n, v, d in rs]
    return "\n".join(lines) + "\n"


def variants(doc: str, plain: list[tuple[str, str, str]], bf16: list[tuple[str, str, str]]) -> str:
    """The two variants' tables, before the specifications."""
    def counts(rs: list[tuple[str, str, str]]) -> str:
        c = Counter(v for _, v, _ in rs)
        return (f"{c['agrees']} agree, {c['refused']} refused, {c['partly refused']} partly refused, "
                f"{c['wrong'] + c['broken'] + c['harness']} wrong or broken, {c['skipped']} skipped (of {len(rs)})")

    text = ("## Variants (a family's config switched)\n\n"
            "Each entry of `VARIANTS` in tests/test_families.py: the family's tiny model built with the variant's config "
            "keys over the family's (its name says which: ALiBi, multi-query, post-norm, a rotary scaling, ...), run "
            "and compared as in the results table. Variants: " + counts(plain) + ". The slow test "
            "`test_family_variant_verdict_is_the_documented_one` asserts each row: an agreeing variant agrees; a "
            "refused one is refused for the reason written here (a config key or tensor it names).\n\n"
            + table(plain, "variant") + "\n"
            "## Variants in bfloat16\n\n"
            "The entries of `BF16_VARIANTS`, saved in bfloat16 and compared as in the bfloat16 table. Variants: "
            + counts(bf16) + "; `test_bfloat16_variant_verdict_is_the_documented_one` asserts each row.\n\n"
            + table(bf16, "variant (bf16)") + "\n")
    if "## Variants" not in doc:
        return doc.replace("## Specifications", text + "## Specifications", 1)
    return re.sub(r"## Variants .*?(?=## Specifications)", lambda m: text, doc, count=1, flags=re.S)


def main() -> None:
    args = sys.argv[1:]
    if "--variants" in args:
        at = args.index("--variants")
        plain, bf16 = rows(args[at + 1]), rows(args[at + 2])
        DOC.write_text(variants(DOC.read_text(), plain, bf16))
        del args[at:at + 3]
    if not args:
        return
    fp32, bf16 = rows(args[0]), rows(args[1])
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
    doc = re.sub(r"## bfloat16 .*?(?=## Variants|## Specifications)", lambda m: bf, doc, flags=re.S)
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
