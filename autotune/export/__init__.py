"""The winning configuration in other trainers' terms: `render(summary, fmt)` for each of `FORMATS`."""

from autotune.export.formats import FORMATS, render

__all__ = ["FORMATS", "render"]
