"""Entry point (``attncli`` and ``python -m attncli``): light, so that Ctrl-C while the CLI is
still importing exits 130 with one line instead of a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from attncli.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("attncli: error: interrupted\n")
        raise SystemExit(130) from None
    cli_main()


if __name__ == "__main__":
    main()
