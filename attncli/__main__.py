"""Entry point (``attncli`` and ``python -m attncli``): light, and the first thing it does is
install attncli.session's signal handlers, so that Ctrl-C, SIGTERM or SIGHUP at any moment
(even while numpy is half imported) exits 130 / 143 / 129 with one line and writes nothing."""

from __future__ import annotations


def main() -> None:
    from attncli import session

    session.install()
    from attncli.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
