"""Entry point (``attncli`` and ``python -m attncli``): light, and the first thing it does is
install attncli.io.session's signal handlers, so that Ctrl-C, SIGTERM or SIGHUP at any moment
(even while numpy is half imported) exits 130 / 143 / 129 with one line and writes nothing.
The last thing it does is leave at once (session.leave): no interpreter shutdown for a
late signal to land in after the output is complete."""

from __future__ import annotations


def main() -> None:
    from attncli.io import session

    session.install()
    code: object = 0
    try:
        from attncli.cli import main as cli_main

        cli_main()
    except SystemExit as e:
        code = e.code
    session.leave(code)


if __name__ == "__main__":
    main()
