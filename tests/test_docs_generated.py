"""docs/families.md and docs/false_alarms.md say what their generators print now (issue 32 item 8).

The cheap parts are regenerated here: the declarations section of docs/families.md (docs/declarations.py, from
attncli.io.families), its counts (from its own results table), the cases docs/false_alarms.md lists (every
declared family the sweep builds, in each dtype), and the variants' tables (every entry of tests/test_families.py's
VARIANTS and BF16_VARIANTS, each agreeing within the sweep's tolerance or refused naming its culprit; their prose and
counts as docs/families_md.py writes them). The verdicts themselves are the slow sweeps' (`pytest -m slow
tests/test_families.py tests/test_check_families.py`): each family's verdict is checked against these tables there,
row by row, and `python tests/test_families.py` / `python tests/test_check_families.py` print the rows (minutes).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_declarations_section_is_what_declarations_py_prints() -> None:
    sys.path.insert(0, str(DOCS))
    try:
        import declarations
    finally:
        sys.path.remove(str(DOCS))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        declarations.main()
    doc = (DOCS / "families.md").read_text()
    section = doc[doc.index("## Declarations"):]
    assert buf.getvalue().strip() in section, "docs/families.md is stale: python docs/families_md.py regenerates it"


def test_the_counts_are_the_results_table_s() -> None:
    doc = (DOCS / "families.md").read_text()
    table = doc[doc.index("## Results"):doc.index("## bfloat16")]
    c = Counter(re.findall(r"^\| [^ |]+ \| ([a-z ]+) \|", table, flags=re.M))
    c.pop("verdict", None)
    said = re.search(r"^Counts now [^:]*: (\d+) agree, (\d+) refused, (\d+) partly refused .*?, (\d+) skipped \(of (\d+)\)",
                     doc, flags=re.M)
    assert said is not None
    assert [int(g) for g in said.groups()] == [c["agrees"], c["refused"], c["partly refused"], c["skipped"],
                                               sum(c.values())]


def test_false_alarms_lists_every_case_the_sweep_runs() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_check_families import DTYPES, families

    doc = (DOCS / "false_alarms.md").read_text()
    listed = set(re.findall(r"^\| ([^ |]+) \| (float32|bfloat16|float16) \|", doc, flags=re.M))
    assert listed == {(mt, dt) for mt in families() for dt in DTYPES}


def test_the_variants_tables_hold_every_variant_with_a_named_verdict() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import BF16_VARIANTS, EXPECTED_VARIANTS, EXPECTED_VARIANTS_BF16, TOL, VARIANTS

    for table, names in ((EXPECTED_VARIANTS, list(VARIANTS)), (EXPECTED_VARIANTS_BF16, BF16_VARIANTS)):
        assert list(table) == names, "docs/families.md's variants are stale: see docs/families_md.py --variants"
        for name, (verdict, detail) in table.items():
            if verdict == "agrees":  # the largest error of its runs, within the sweep's tolerance
                assert 0 <= float(detail) <= TOL, (name, detail)
            else:  # one line of attncli naming the file (config.json and its key, or the tensor) and why
                assert verdict == "refused", (name, verdict, detail)
                assert re.match(r"FOLDER(/config\.json)?: \S", detail), (name, detail)
                assert "not supported" in detail and not re.search(r"Error|Traceback|exit \d|harness", detail), detail


def test_the_variants_section_is_what_families_md_writes_from_its_rows() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(DOCS))
    try:
        import families_md
        from test_families import EXPECTED_VARIANTS, EXPECTED_VARIANTS_BF16
    finally:
        sys.path.remove(str(DOCS))
    doc = (DOCS / "families.md").read_text()
    rows = [[(n, v, d) for n, (v, d) in t.items()] for t in (EXPECTED_VARIANTS, EXPECTED_VARIANTS_BF16)]
    assert families_md.variants(doc, *rows) == doc  # the counts and the prose say what the rows hold
