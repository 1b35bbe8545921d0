"""Reports read from a command's own output: a script that prints `step 250: train loss 2.31,
val loss 2.35` (or a Hugging Face Trainer's `{'eval_loss': 2.35, ...}`) needs no autotune line.

The study file names a pattern per figure (`task.metric_from`, `step_from`, `loss_from`,
`samples_from`, `epoch_from`), each a regular expression whose first group captures a number;
every line the command writes, to stdout or stderr, is matched against each, and a line that
matches any becomes one report of the figures it matched, read at the moment autotune reads it
(the reporting protocol's JSON line, as the script would have written it; protocol.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from autotune.spec.command_task import FROM_KEYS

WHOLE = {"step", "samples"}  # written as whole numbers in a report


class Patterns:
    """The figures' patterns of one study, matched line by line."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        self.compiled = {FROM_KEYS[key]: re.compile(p) for key, p in patterns.items()}
        self.metric_pattern = patterns.get("metric_from")
        self.matched_metric = False

    def reports(self, lines: Iterable[str]) -> list[str]:
        """The reports (as protocol lines) in `lines`: one for each line that matches a pattern
        with a number."""
        found = []
        for line in lines:
            report = {}
            for key, pattern in self.compiled.items():
                match = pattern.search(line)
                value = _number(match.group(1)) if match else None
                if value is not None:
                    report[key] = int(value) if key in WHOLE and value.is_integer() else value
            if report:
                self.matched_metric = self.matched_metric or "metric" in report
                found.append(json.dumps(report))
        return found


def _number(text: str | None) -> float | None:
    try:
        return float(text.replace(",", "")) if text is not None else None
    except ValueError:
        return None
