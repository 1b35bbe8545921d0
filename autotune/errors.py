"""Errors a user can cause. The CLI turns each into one line and exit status 2."""

from __future__ import annotations


class AutotuneError(Exception):
    """A mistake in the user's input or environment, reported without a traceback."""

    exit_code = 2


class SpecError(AutotuneError):
    """A study file (or a preset it names) that does not describe a valid study."""

    def __init__(self, path: object, key: str, value: object, accepted: str) -> None:
        self.path, self.key, self.value, self.accepted = path, key, value, accepted
        super().__init__(f"{path}: {key}: got {shown(value)}; {accepted}")


SHOWN_CHARS = 200  # of a value quoted in an error: a YAML alias can make one of millions


def shown(value: object) -> str:
    """`repr(value)`, cut to SHOWN_CHARS with the length it had."""
    text = repr(value)
    return (
        text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text):,} characters)"
    )


class TaskError(AutotuneError):
    """A task that cannot be found, imported or built."""


class StorageError(AutotuneError):
    """A storage URL that cannot be opened or a study that is not there."""
