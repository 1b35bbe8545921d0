"""The study file's command task: `task: {command: ..., env: ..., cwd: ..., values: ...,
metric_from: ...}`, a training script of the user's run once per trial
(autotune/runners/command.py). Its reader checks everything a trial would trip on before any
trial runs, and raises `SpecError` naming the file, the key, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.search.space import KNOBS, SCHEDULE, Choices, Space
from autotune.spec import command_line
from autotune.spec.checks import reject_unknown, require

# A command task's patterns, read from its output (runners/output_metrics.py): the study file's
# key -> the report's key it fills.
FROM_KEYS = {
    "metric_from": "metric",
    "step_from": "step",
    "loss_from": "loss",
    "samples_from": "samples",
    "epoch_from": "epoch",
}
KEYS = ("command", "env", "cwd", "values", *FROM_KEYS)


@dataclasses.dataclass(frozen=True)
class CommandTask:
    """A training command run once per trial, in `cwd` (the study file's folder by default)."""

    command: str | tuple[str, ...]  # a string is split like a shell would; never run through one
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables, placeholders allowed
    # figure -> the pattern reading it from the command's output (runners/output_metrics.py)
    patterns: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None  # as the study file gives it: relative to the study file's folder
    # name -> ((value, how the command writes it), ...): the script's own terms for a value
    values: tuple[tuple[str, tuple[tuple[Any, str], ...]], ...] = ()

    def describe(self) -> dict[str, Any]:
        """As the study's definition stores it; cwd and values only where given, so that studies
        stored before they existed still match."""
        described = {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "env": dict(self.env),
            **dict(self.patterns),
        }
        if self.cwd is not None:
            described["cwd"] = self.cwd
        if self.values:
            described["values"] = {name: [list(p) for p in pairs] for name, pairs in self.values}
        return described

    def folder(self, study_path: Path) -> Path:
        """Where the command runs: `cwd` from the study file's folder, or that folder."""
        return folder(study_path, self.cwd)

    def written_as(self) -> dict[str, dict[Any, str]]:
        return {name: dict(pairs) for name, pairs in self.values}

    def knobs_read(self) -> tuple[str, ...]:
        """The knobs its command line or environment names, in KNOBS order: every knob where it
        names {config_file} (the script reads the whole configuration); {max_epochs} is the
        schedule's length (schedule_epochs)."""
        names = command_line.placeholders(self.command, dict(self.env))
        if "config_file" in names:
            return tuple(KNOBS)
        if "max_epochs" in names:
            names.add(SCHEDULE)
        return tuple(knob for knob in KNOBS if knob in names)


def folder(study_path: Path, cwd: str | None) -> Path:
    """The folder a command runs in: `cwd` (as the study file or its stored definition gives it)
    from the study file's folder, or that folder."""
    return (study_path.resolve().parent / (cwd or ".")).resolve()


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with `pattern` as a figure's pattern, or None."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    if compiled.groups < 1:
        return "a regular expression with a group around the number, e.g. 'val loss ([0-9.eE+-]+)'"
    return None


def command_task(path: Path, raw: Mapping[str, Any], space: Space) -> CommandTask:
    """`task: {command: ..., env: {...}}`: its placeholders must name knobs, parameters or the
    names the runner fills, and its program must exist, before any trial runs."""
    reject_unknown(path, "task.", raw, KEYS)
    command = raw.get("command")
    if isinstance(command, list) and all(isinstance(arg, str) for arg in command) and command:
        command = tuple(command)
    require(
        path,
        "task.command",
        command,
        (isinstance(command, str) and command.strip() != "") or isinstance(command, tuple),
        "a command line (a string, or a list of its arguments) with {knob} placeholders",
    )
    env = _env(path, raw.get("env") or {})
    known = [*KNOBS, *dict(space.params)]
    for key, value in env.items():  # a placeholder is named where it is written
        try:
            command_line.validate((value,), known=known, cwd=None)
        except ValueError as exc:
            raise SpecError(
                path, f"task.env.{key}", value, str(exc).replace("the command names", "it names")
            ) from None
    cwd = _cwd(path, raw.get("cwd"))
    try:
        command_line.validate(command, known=known, cwd=folder(path, cwd))
    except ValueError as exc:
        raise SpecError(
            path, "task.command", command if isinstance(command, str) else list(command), str(exc)
        ) from None
    patterns = {key: raw[key] for key in FROM_KEYS if raw.get(key) is not None}
    for key, pattern in patterns.items():
        why = pattern_problem(pattern) if isinstance(pattern, str) else "a regular expression"
        require(path, f"task.{key}", pattern, why is None, str(why))
    named = command_line.placeholders(command, env)
    return CommandTask(
        command=command,
        env=tuple(env.items()),
        patterns=tuple(patterns.items()),
        cwd=raw.get("cwd"),
        values=_values(path, raw.get("values"), space, named),
    )


def _env(path: Path, env: Any) -> dict[str, str]:
    require(
        path,
        "task.env",
        env,
        isinstance(env, Mapping),
        "a mapping of environment variable names to values",
    )
    for key, value in env.items():
        # What the operating system takes as a variable's name and value: no '=' in a name, no NUL
        # anywhere.
        require(
            path,
            f"task.env.{key}",
            key,
            isinstance(key, str) and key != "" and "=" not in key and "\0" not in key,
            "a variable's name: text without '=' or NUL",
        )
        require(
            path,
            f"task.env.{key}",
            value,
            isinstance(value, (str, int, float))
            and not isinstance(value, bool)
            and "\0" not in str(value),
            "a string or a number (with no NUL character)",
        )
    return {key: str(value) for key, value in env.items()}


def _cwd(path: Path, cwd: Any) -> str:
    """The folder the command runs in, checked: a folder that exists, from the study file's."""
    if cwd is None:
        return "."
    require(
        path,
        "task.cwd",
        cwd,
        isinstance(cwd, str) and cwd != "" and "\0" not in cwd,
        "a folder the command runs in, relative to the study file's folder (or absolute)",
    )
    where = folder(path, cwd)
    require(path, "task.cwd", cwd, where.is_dir(), f"an existing folder; {where} is not one")
    return cwd


def _values(
    path: Path, raw: Any, space: Space, named: set[str]
) -> tuple[tuple[str, tuple[tuple[Any, str], ...]], ...]:
    """`values: {precision: {bf16: bfloat16, fp32: float32}}`: how the command writes a knob's (or
    a parameter's) values. Each name must be one the command names; each value one the knob
    takes (a parameter: one of its choices); a value left out is written as usual."""
    if raw is None:
        return ()
    require(
        path,
        "task.values",
        raw,
        isinstance(raw, Mapping),
        "a mapping of knob names to {value: how the command writes it}",
    )
    domains = {**dict(space.domains), **dict(space.params)}
    maps = []
    for name, written in raw.items():
        key = f"task.values.{name}"
        require(path, key, name, name in domains, f"a knob or parameter: {', '.join(domains)}")
        require(
            path,
            key,
            name,
            name in named,
            f"a name the command or its env writes as {{{name}}}; it names none",
        )
        require(
            path,
            key,
            written,
            isinstance(written, Mapping) and written != {},
            "a mapping of the knob's values to how the command writes each, "
            "e.g. {bf16: bfloat16, fp16: float16, fp32: float32}",
        )
        domain = domains[name]
        require(
            path,
            key,
            name,
            name in KNOBS or isinstance(domain, Choices),
            "a knob, or a parameter with choices; a range's numbers are written as numbers",
        )
        pairs = []
        for value, text in written.items():
            require(path, f"{key}.{value}", value, *_takes(name, value, domain))
            require(
                path,
                f"{key}.{value}",
                text,
                isinstance(text, (str, int, float)) and "\0" not in str(text),
                "a string or a number: how the command writes the value",
            )
            pairs.append((value, text if isinstance(text, str) else command_line.as_argument(text)))
        maps.append((name, tuple(pairs)))
    return tuple(maps)


def _takes(name: str, value: Any, domain: Any) -> tuple[bool, str]:
    """Whether `name` can take `value` (a knob: any value it accepts, searched here or not; a
    parameter: one of its choices), and what it takes."""
    if name in KNOBS:
        why = KNOBS[name].check(value)
        return why is None, str(why)
    choices = domain.values
    return any(_same(value, c) for c in choices), (
        f"one of the values of {name}: {', '.join(map(command_line.as_argument, choices))}"
    )


def _same(value: Any, choice: Any) -> bool:
    """Equal, and both booleans or neither: True is not the batch size 1."""
    return isinstance(value, bool) == isinstance(choice, bool) and value == choice
