"""Errors a user can cause. The CLI turns each into one line and exit status 2."""

from __future__ import annotations


class AutotuneError(Exception):
    """A mistake in the user's input or environment, reported without a traceback."""

    exit_code = 2


class SpecError(AutotuneError):
    """A study file (or a preset it names) that does not describe a valid study."""

    def __init__(self, path: object, key: str, value: object, accepted: str) -> None:
        self.path, self.key, self.value, self.accepted = path, key, value, accepted
        super().__init__(f"{path}: {key}: got {value!r}; {accepted}")


class TaskError(AutotuneError):
    """A task that cannot be found, imported or built."""


class StorageError(AutotuneError):
    """A storage URL that cannot be opened or a study that is not there."""
