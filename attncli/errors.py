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
        super().__init__(f"{source}: {message}" if source else message)


class BackendError(AttnError, RuntimeError):
    """A requested backend or device is not available (torch missing, no GPU, ...)."""
