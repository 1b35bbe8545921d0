"""A storage that holds something else, a file of another program's or a study that autotune did
not make: refused before Optuna would write to it.

Read only; what the storage holds is left exactly as it was.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from autotune.errors import StorageError
from autotune.record import schema
from autotune.spec.study_file import StudySpec

# The tables Optuna's RDB storage creates. A kill while it creates them leaves some: such a file
# is still Optuna's, and opening it again creates the rest.
OPTUNA_TABLES = {
    "alembic_version",
    "studies",
    "study_directions",
    "study_system_attributes",
    "study_user_attributes",
    "trial_heartbeats",
    "trial_intermediate_values",
    "trial_params",
    "trial_system_attributes",
    "trial_user_attributes",
    "trial_values",
    "trials",
    "version_info",
}


def refuse_sqlite(spec: StudySpec, path: Path) -> None:
    """An SQLite file with tables, none of them Optuna's, belongs to something else: Optuna would
    add its tables to it. Read-only; a file that is no database is left to Optuna's own error."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            tables = {
                row[0]
                for row in connection.execute("select name from sqlite_master where type = 'table'")
            }
    except sqlite3.Error:
        return
    if tables and not tables & OPTUNA_TABLES:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise StorageError(
            f"{spec.path}: storage: {path} is an SQLite database of something else "
            f"(tables: {shown}), not an autotune study; choose another file with --storage or "
            f"storage:"
        )


def refuse_journal(spec: StudySpec, path: Path) -> None:
    """A journal file whose first line is no journal record is something else (or corrupt):
    Optuna would append to it. Read only its first line."""
    with path.open("rb") as file:
        first = file.readline(1 << 20)
    if not first.strip():
        return  # empty: a journal not yet written
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    if not (isinstance(record, dict) and "op_code" in record):
        raise StorageError(
            f"{spec.path}: storage: {path} is not an Optuna journal (its first line is no journal "
            f"record), so it is left as it is; choose another file with --storage or storage:"
        )


def refuse_foreign_study(spec: StudySpec, study: Any) -> None:
    """A study of the same name that autotune did not make (plain Optuna's, say): autotune would
    write its settings into it and count its trials against the budget."""
    trials = len(study.get_trials(deepcopy=False))
    minimize = [d.name for d in study.directions] == ["MINIMIZE"]
    if not schema.made_by_autotune(study.user_attrs, trials=trials, minimize=minimize):
        raise StorageError(
            f"{spec.path}: storage {spec.storage} holds a study named {spec.name!r} ({trials} "
            f"trial(s)) that autotune did not make; it is left as it is: give this study another "
            f"name (name: in the study file) or another storage (--storage)"
        )
