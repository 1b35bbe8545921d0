"""`render(summary, fmt)`: the winner written for another tool; yaml and json are the flat
settings."""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from autotune.errors import AutotuneError
from autotune.export import flags, hf, lightning, pytorch
from autotune.export.common import provenance, settings
from autotune.record.summary import Summary


def flat(summary: Summary) -> dict:
    """The winner's settings, then devices_per_trial where it trained on more than one."""
    devices = summary.devices_per_trial
    return {**settings(summary), **({"devices_per_trial": devices} if devices != 1 else {})}


def flat_json(summary: Summary) -> str:
    """The winner's settings as one flat JSON mapping: the knobs, then the user's parameters."""
    return json.dumps(flat(summary), indent=2) + "\n"


def flat_yaml(summary: Summary) -> str:
    """The same mapping in YAML, with where it came from as a comment."""
    return f"# {provenance(summary)}\n" + yaml.safe_dump(flat(summary), sort_keys=False)


RENDERERS: dict[str, Callable[[Summary], str]] = {
    "yaml": flat_yaml,
    "json": flat_json,
    "lightning": lightning.render,  # JSON: Trainer, DataLoader, optimizer and LR scheduler sections
    "hf": hf.render,  # JSON: transformers.TrainingArguments keyword arguments
    "torch": pytorch.render,  # a Python module in plain PyTorch
    "args": flags.render,  # one line of command-line flags
}
# command: the study's own command line (export/command.py), which needs what its trials ran
FORMATS = (*RENDERERS, "command")


def looks_like_export(text: str) -> bool:
    """Whether `text` is what some `autotune export` wrote: those that can carry their provenance
    do ("autotune study ..."); flat JSON is a mapping with the knobs; args one line of flags."""
    if "autotune study " in text[:4096]:
        return True
    try:
        loaded = json.loads(text)
    except ValueError:
        loaded = None
    if isinstance(loaded, dict):
        return {"lr", "batch_size", "precision"} <= set(loaded)
    lines = text.strip().splitlines()
    return len(lines) == 1 and {"--lr", "--batch-size", "--precision"} <= set(lines[0].split())


def render(summary: Summary, fmt: str) -> str:
    """The winner of `summary` (with a winner) in format `fmt`."""
    if fmt not in RENDERERS:  # command: export/command.render, given what its trials ran
        raise AutotuneError(f"--format: got {fmt!r}; expected one of {', '.join(FORMATS)}")
    return RENDERERS[fmt](summary)
