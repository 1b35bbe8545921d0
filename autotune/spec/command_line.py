"""A study's command line, with `{name}` placeholders filled from one trial's configuration.

    python train.py --lr {lr} --batch-size {batch_size} {pin_memory:--pin-memory/--no-pin-memory}

A string command is split like a POSIX shell would (shlex) and is never run through a shell: no
pipes, globs or `$VARS`; a list is taken as the arguments themselves. Placeholders are filled in
each argument separately, so a value never splits into two arguments or reaches a shell.

Names: every key of the trial's configuration (the knobs and the study's own parameters), and
`seed`, `device` (cpu, cuda, cuda:N), `max_epochs` (the budget's, also the LR schedule's length),
`eval_every` (the budget's epochs between evaluations)
and `config_file` (the JSON file described in autotune/runners/protocol.py).

How a value is written:

    str                  as it is
    int                  12
    {name:YES/NO}        YES when the value is true (true, non-zero, non-empty), NO otherwise:
                         {pin_memory:--pin-memory/--no-pin-memory}, {pin_memory:--pin-memory/}
    a mapped value       as the task's `values:` writes it: with `values: {precision: {bf16:
                         bfloat16}}`, {precision} is bfloat16 where the value is bf16
    float                the shortest form that reads back as the same number: 0.01, 1e-05;
                         a whole number without a fraction (8.0 -> 8), so `type=int` parses it
    bool                 True / False: what Python's literal_eval, Hydra, Fire, jsonargparse and
                         `value.lower() == "true"` all read (argparse's `type=bool` reads any
                         non-empty text as True: use {name:YES/NO} or a `values:` map there)
    None                 the whole argument holding the placeholder is left out, so write
                         `--prefetch-factor={prefetch_factor}` as one argument: without workers
                         the option is gone and the script's default applies

An argument that comes out empty is left out too. `{{` and `}}` are literal braces. The same rules
fill the values of the study's `env:` mapping; a None leaves the variable unset.
"""

from __future__ import annotations

import difflib
import os
import shlex
import shutil
import string
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.search.space import RESERVED  # filled beside the configuration

_FORMATTER = string.Formatter()


def split(command: str | Sequence[str]) -> tuple[str, ...]:
    """The command's arguments; a ValueError for an empty command or an unclosed quote."""
    if isinstance(command, str):
        try:
            args = tuple(shlex.split(command))
        except ValueError as exc:  # "No closing quotation"
            raise ValueError(f"the command cannot be split into arguments: {exc}") from None
    else:
        args = tuple(command)
        if not all(isinstance(arg, str) for arg in args):
            raise ValueError(
                f"every argument of the command must be a string, but got {list(args)!r}"
            )
    if not args:
        raise ValueError("the command is empty; give the program to run and its arguments")
    return args


def placeholders(command: str | Sequence[str], env: Mapping[str, str] | None = None) -> set[str]:
    """The names the command (and the values of `env`) use; a ValueError for a malformed
    placeholder."""
    names: set[str] = set()
    for template in (*split(command), *(env or {}).values()):
        names.update(name for name, _ in _fields(template))
    return names


def validate(
    command: str | Sequence[str],
    *,
    known: Collection[str],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> None:
    """Check the command before any trial runs: well-formed placeholders naming only `known` names
    (the configuration's; `RESERVED` are added here) and, given `cwd`, a program that can be found.

    Raises ValueError saying what is wrong and what would be accepted.
    """
    allowed = set(known) | set(RESERVED)
    for name in sorted(placeholders(command, env) - allowed):
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f" (did you mean {{{close[0]}}}?)" if close else ""
        raise ValueError(
            f"the command names an unknown placeholder {{{name}}}{hint}; "
            f"known names: {', '.join(sorted(allowed))}"
        )
    program = split(command)[0]
    if cwd is not None and not list(_fields(program)) and find_program(program, cwd=cwd) is None:
        raise ValueError(
            f"the command's program {program!r} is not an executable file "
            f"({'relative to ' + str(cwd) if os.sep in program else 'on the PATH'})"
        )
    script = _python_script(split(command))
    if cwd is not None and script is not None and not (cwd / script).is_file():
        raise ValueError(f"the command's script {script!r} is not a file (relative to {cwd})")


def _python_script(args: Sequence[str]) -> str | None:
    """The .py file a `python ... script.py` command runs (its first argument that is not an
    option), where it names one without placeholders; None for any other command."""
    if not Path(args[0]).name.startswith("python"):
        return None
    first = next((arg for arg in args[1:] if not arg.startswith("-")), None)
    if first is None or not first.endswith(".py") or list(_fields(first)):
        return None
    return first


def fill(
    template: str, values: Mapping[str, Any], written: Mapping[str, Mapping[Any, str]] | None = None
) -> str | None:
    """One argument with its placeholders filled, a value in `written[name]` as it says; None
    when it is to be left out (see the module's doc)."""
    parts = []
    for literal, name, spec in _parse(template):
        parts.append(literal)
        if name is None:
            continue
        value = values[name]
        if spec:
            parts.append(spec.split("/", 1)[0] if value else spec.split("/", 1)[1])
        elif value is None:
            return None
        else:
            parts.append(_mapped((written or {}).get(name, {}), value))
    text = "".join(parts)
    return text or None


def fill_all(
    templates: Iterable[str],
    values: Mapping[str, Any],
    written: Mapping[str, Mapping[Any, str]] | None = None,
) -> list[str]:
    return [arg for arg in (fill(t, values, written) for t in templates) if arg is not None]


def _mapped(written: Mapping[Any, str], value: Any) -> str:
    """`value` as the map writes it (a boolean matching only a boolean), else as_argument's."""
    for key, text in written.items():
        if isinstance(key, bool) == isinstance(value, bool) and key == value:
            return text
    return as_argument(value)


def as_argument(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def search_path(env: Mapping[str, str]) -> str:
    """The command's PATH: the folder of the Python running autotune first, so that `python` in a
    command is this Python, with torch and autotune, also when its virtualenv is not activated."""
    return os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])


def find_program(program: str, *, cwd: Path) -> str | None:
    """The program's path as the command will find it, or None."""
    if os.sep in program:
        path = cwd / program
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(program, path=search_path(os.environ))


def _parse(template: str) -> list[tuple[str, str | None, str]]:
    """(literal text, placeholder name or None, its YES/NO spec) per piece; ValueError if
    malformed."""
    try:
        pieces = list(_FORMATTER.parse(template))
    except ValueError as exc:  # "Single '}' encountered", "expected '}' before end of string"
        raise ValueError(
            f"malformed placeholder in {template!r}: {exc}; write {{{{ and }}}} for literal braces"
        ) from None
    parsed = []
    for literal, name, spec, conversion in pieces:
        if name is not None:
            if not name.isidentifier() or conversion or "{" in (spec or ""):
                raise ValueError(
                    f"malformed placeholder in {template!r}: a placeholder is {{name}} or "
                    f"{{name:IF_TRUE/IF_FALSE}}, "
                    f"but got {{{name}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}}"
                )
            if spec and spec.count("/") != 1:
                raise ValueError(
                    f"malformed placeholder {{{name}:{spec}}} in {template!r}: after the colon "
                    f"comes IF_TRUE/IF_FALSE, two texts split by one slash"
                )
        parsed.append((literal, name, spec or ""))
    return parsed


def _fields(template: str) -> Iterable[tuple[str, str]]:
    return [(name, spec) for _, name, spec in _parse(template) if name is not None]
