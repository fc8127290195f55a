"""Peak memory and time of the largest refused input of each format, and the parse time of
each text format at its limit (issue 17). Every case runs ``attncli`` in a child process whose
peak resident memory is its ru_maxrss; a tiny run is measured first as the
baseline (the interpreter, numpy, typer: what any run costs).

    python benchmarks/refused_inputs.py            # about a minute on 2 cores, ~0.5 GB of temporary files
    python benchmarks/refused_inputs.py --quick    # the refusals only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# A small process between this one and attncli: a child forked from a big parent would count the
# parent's pages in its peak, so the peak is read by a parent that never held anything.
WRAP = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def attncli(args: list[str], cwd: Path, stdin: Callable[[], Iterator[bytes]] | None = None,
            code: str | None = None) -> tuple[int, float, float]:
    """(exit code, peak MiB, seconds) of ``python -m attncli ARGS`` (or ``python -c CODE``)."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "attncli", *args]
    peak_file = cwd / "peak.txt"
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", WRAP, str(peak_file), *cmd], cwd=cwd, env=ENV,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if stdin is not None:
        assert proc.stdin is not None
        try:
            for chunk in stdin():
                proc.stdin.write(chunk)
        except BrokenPipeError:  # refused: attncli stopped reading
            pass
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    exit_code = proc.wait()
    secs = time.monotonic() - start
    kib = int(peak_file.read_text())
    return exit_code, (kib if sys.platform != "darwin" else kib / 1024) / 1024, secs


def repeat(first: bytes, body: bytes, total: int) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        yield first
        chunk = body * max(1, MB // len(body))
        for _ in range(total // len(chunk)):
            yield chunk
    return gen


def npy_header(shape: str) -> bytes:
    d = "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }"
    h = d + " " * (118 - len(d)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode()


BOMB = """
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as zf, zf.open("q.npy", "w", force_zip64=True) as f:
    f.write(bytes.fromhex(sys.argv[2]))
    for _ in range(32):
        f.write(bytes(64 << 20))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the refusals only (no parse times at the limits)")
    quick = parser.parse_args().quick
    rows: list[tuple[str, str, int, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "x.npy").write_bytes(npy_header("(2, 2)") + bytes(32))
        code, base, secs = attncli(["run", "x.npy", "-q"], d)
        rows.append(("baseline: run on a 2x2 .npy", "-", code, base, secs))

        def case(what: str, limit: str, args: list[str], **kw: object) -> None:
            rows.append((what, limit, *attncli(args, d, **kw)))  # type: ignore[arg-type]

        case("stdin: 256 MiB of zero bytes (sniffed as YAML)", "4 MiB", ["check", "-e", "-", "x.npy"],
             stdin=repeat(b"", b"\0", 256 * MB))
        case("stdin: 256 MiB of JSON '[0, 0, ...'", "64 MiB", ["run", "-"], stdin=repeat(b"[", b"0, ", 256 * MB))
        case("stdin: 256 MiB of CSV '1,2'", "64 MiB", ["self", "-"], stdin=repeat(b"", b"1,2\n", 256 * MB))
        case("stdin: .npy declaring 1 TiB, then 256 MiB", "free/2", ["run", "-"],
             stdin=repeat(npy_header("(137438953472,)"), b"\0", 256 * MB))
        (d / "big.yaml").write_bytes(b"q: [" + b"0, " * (4 * MB // 3) + b"0]\n")
        case("file: YAML of 4 MiB + 4 bytes (size)", "4 MiB", ["run", "big.yaml"])
        (d / "items.json").write_bytes(b"[" + b"0," * (32 * MB - 100) + b"0]")
        case("file: JSON of 64 MiB, 32 M numbers (commas counted)", "10 M values", ["run", "items.json"])
        subprocess.run([sys.executable, "-c", BOMB, str(d / "bomb.npz"), npy_header(f"({(2 << 30) >> 3},)").hex()],
                       check=True)  # in a child: the zip writer's buffers stay out of this process
        size = (d / "bomb.npz").stat().st_size
        bomb = ("import sys, attncli.io.files as a; a.memory_limit = lambda: 1 << 30; "
                "sys.argv = ['attncli', 'run', 'bomb.npz']; from attncli.__main__ import main; main()")
        case(f".npz of {size / MB:.1f} MiB inflating to 2 GiB (free memory pretended 1 GiB)", "1 GiB", [], code=bomb)
        if not quick:
            rows.append(("-- accepted at the limits (parse + tiny compute) --", "", 0, 0.0, 0.0))
            line = b"[" + b", ".join([b"0.123456"] * 64) + b"]"
            (d / "ok.yaml").write_bytes(b"q: [" + b", ".join([line] * ((4 * MB - 100) // (len(line) + 2))) + b"]\n")
            reader = "import sys; from attncli.io.files import Reader; Reader().read(sys.argv[1])"
            for name, make in (("ok.yaml", None),
                               ("ok.json", lambda: b"[" + b",".join([line] * ((64 * MB - 100) // (len(line) + 1))) + b"]"),
                               ("ok.csv", lambda: (b",".join([b"0.123456"] * 64) + b"\n") * ((64 * MB - 100) // 576))):
                if make is not None:
                    (d / name).write_bytes(make())
                code, peak, secs = attncli([], d, code=reader.replace("sys.argv[1]", repr(name)))
                rows.append((f"read {name} ({(d / name).stat().st_size / MB:.1f} MiB)", "limit", code, peak, secs))
            code, peak, secs = attncli([], d, code="from attncli.io.files import Reader; Reader().read('bomb.npz')")
            rows.append(("read bomb.npz: 2 GiB inflated, streamed", "free", code, peak, secs))
    print(f"{'case':<72} {'limit':>11} {'exit':>4} {'peak MiB':>9} {'+base':>7} {'s':>6}")
    for what, limit, code, peak, secs in rows:
        extra = f"{peak - base:7.0f}" if peak else ""
        print(f"{what:<72} {limit:>11} {code:>4} {peak:9.0f} {extra:>7} {secs:6.2f}")


if __name__ == "__main__":
    main()
