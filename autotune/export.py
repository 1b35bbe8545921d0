"""The winning configuration written for other tools: exactly the knobs, nothing to strip."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from autotune.report import speedup_phrase

FORMATS = ("yaml", "json")


def render(summary: Mapping[str, Any], fmt: str) -> str:
    """The winner's knobs as a flat mapping; YAML also says where they came from, in comments."""
    best = summary["best"]
    if fmt == "json":
        return json.dumps(best["params"], indent=2) + "\n"
    target = summary["target"]
    provenance = (
        f"# autotune study {summary['study']}, trial {best['trial']} ({best['source']}, {best['runs']} run(s)):\n"
        f"# {target['metric']} >= {target['value']} in {best['time_to_target']:.3f} s"
    )
    if summary["speedup"]:
        provenance += f", {speedup_phrase(summary['speedup'])} than the baseline"
    return provenance + "\n" + yaml.safe_dump(dict(best["params"]), sort_keys=False)
