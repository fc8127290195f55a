"""Domain errors. The core raises these; the CLI turns them into one line and exit code 2."""

from __future__ import annotations


class AttnError(Exception):
    """Base class for every error that is the user's to fix (exit code 2)."""


class InputError(AttnError, ValueError):
    """A file, array or option is missing, malformed or inconsistent.

    ``source`` names the file (or ``<stdin>``, ``--option``) the problem came from,
    so the message can start with it.
    """

    def __init__(self, message: str, source: str | None = None) -> None:
        self.source = source
        if source:
            message = f"{printable(source, 120)}: {message}"
        super().__init__(printable(message, MESSAGE_LIMIT))


class BackendError(AttnError, RuntimeError):
    """A requested backend or device is not available (torch missing, no GPU, ...)."""


MESSAGE_LIMIT = 280  # characters: every message stays one line under 300 with the program's prefix


def printable(text: str, limit: int = 200) -> str:
    """Text safe to print on one line: control characters (a newline or an escape sequence in
    a file name or a label from anywhere could clear or retitle the terminal) written as
    escapes, and at most ``limit`` characters."""
    head = text[: limit + 1]  # escaping only lengthens: the first limit + 1 characters decide what is shown
    out = head if head.isprintable() else "".join(  # the common case at C speed (10^5 labels)
        c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in head)
    return out if len(out) <= limit else out[: limit - 1] + "…"
