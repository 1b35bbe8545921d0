"""What a study stores, in one place: every attribute key, how results are written and read back,
and the readers that keep studies stored by earlier versions readable.
"""

from __future__ import annotations

# Modules that held stored references (a task's optimizer, `module:function`) before they moved.
MOVED_MODULES = {"autotune.tasks": "autotune.train.tasks"}


def current_reference(reference: str | None) -> str | None:
    """A stored `module:function` reference as it is named today."""
    if reference is None or ":" not in reference:
        return reference
    module, _, name = reference.partition(":")
    return f"{MOVED_MODULES.get(module, module)}:{name}"
