"""The winning configuration in other trainers' terms: `render(summary, fmt)` for each of
`FORMATS`."""

from autotune.export.formats import FORMATS, looks_like_export, render

__all__ = ["FORMATS", "looks_like_export", "render"]
