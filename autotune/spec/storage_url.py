"""A study's storage URL: the schemes autotune accepts, and by default a SQLite file beside the
study file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.spec.checks import require

# sqlite: one process (the default); journal: Optuna's journal file, for several local workers;
# postgresql/mysql: a database server, for workers on several machines.
STORAGE_SCHEMES = ("sqlite", "journal", "postgresql", "mysql")


def storage_url(path: Path, storage: Any) -> str:
    """The storage URL; by default a SQLite file beside the study file, named after it."""
    if storage is None:
        storage = f"sqlite:///{path.resolve().parent / (path.stem + '.db')}"
    scheme = storage.split("://", 1)[0].split("+", 1)[0] if isinstance(storage, str) else None
    require(
        path,
        "storage",
        storage,
        scheme in STORAGE_SCHEMES and "://" in storage and "\0" not in storage,
        "a storage URL: sqlite:///study.db (one process), "
        "journal:///study.journal (several local workers) "
        "or postgresql://user@host/db (several machines)",
    )
    if scheme in ("sqlite", "journal"):
        file = storage.split(":///", 1)[1] if ":///" in storage else ""
        require(
            path,
            "storage",
            storage,
            file not in ("", ":memory:") and not file.startswith("?"),
            f"a file to keep the study in, "
            f"as {scheme}:///study.{'db' if scheme == 'sqlite' else 'journal'} "
            + (
                "(an in-memory database would end with the run, and the study could not resume)"
                if scheme == "sqlite"
                else "(a journal URL names its file)"
            ),
        )
    return storage


def local_path(url: str) -> Path | None:
    """The file behind a SQLite or journal URL; None for a database server. A SQLite URL's
    `?query` (SQLAlchemy's options, such as `?timeout=5`) is no part of the file's name."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///").partition("?")[0])
    if url.startswith("journal:///"):
        return Path(url.removeprefix("journal:///"))
    return None


def logs_folder(url: str, study_path: Path, name: str) -> Path:
    """The folder a command study keeps each run's output in: beside its storage file (one of a
    database server's studies, beside its study file, named after the study)."""
    stored = local_path(url)
    if stored is not None:
        return stored.parent / f"{stored.name}.logs"
    return study_path.resolve().parent / f"{name}.logs"
