"""A study's learning curves and its systems probe as TensorBoard event files (`autotune report
--tensorboard DIR`), made from the storage alone, so that a study run before the option existed
has them too.

One TensorBoard run per training run: DIR/trial-N (a trial's first run) and
DIR/confirmation/LABEL-seed-S (each confirmation run: the baseline, the trials, a fp32 twin).
Each evaluation is a point of the metric (tag: the metric's name), of the epochs trained (tag
`epochs`) and, where the run stored it, of the mean training loss since the evaluation before
(tag `loss`), at the step of its training clock in milliseconds and at the wall time the trial
began plus that clock. The probe's measurements go under DIR/probe (tensorboard_probe.py).
Written with tensorboard's own event writer, which needs neither torch nor TensorFlow;
`tensorboard` is an optional dependency (autotune[tensorboard]).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autotune.errors import AutotuneError
from autotune.record import runs, schema

EVENT_FILE = "events.out.tfevents."  # how every TensorBoard event file's name begins
MISSING = (
    "--tensorboard needs the tensorboard package, which is not installed: "
    "pip install 'autotune[tensorboard]' (or pip install tensorboard)"
)


def write(
    folder: Path,
    trials: Iterable[Any],
    confirmation: Mapping[str, Any] | None,
    *,
    metric: str,
    protected: Iterable[Path] = (),
) -> int:
    """Write every stored curve under `folder`; the number of runs written. Event files an earlier
    `--tensorboard` left in the folders it writes are replaced, so a second report does not
    double every point; never one of the `protected` files (the study's own)."""
    written = [
        (Path(f"trial-{trial.number}"), _start(trial), points)
        for trial in trials
        if (points := runs.points(schema.measured(trial)))
    ]
    for run in (confirmation or {}).get("runs", []):
        if points := runs.points(run):
            name = f"{_slug(run['label'])}-seed-{run['seed']}"
            written.append((Path("confirmation") / name, 0.0, points))
    tensorboard = load()
    for name, start, points in written:
        events = [
            scalars(
                tensorboard,
                [(metric, p.metric), ("epochs", p.epochs), ("loss", p.loss)],
                step=round(p.seconds * 1000),
                wall_time=start + p.seconds,
            )
            for p in points
        ]
        write_run(tensorboard, folder / name, events, protected=protected)
    return len(written)


def check_folder(folder: Path) -> None:
    """A folder to write into (made if missing): not a file, and tensorboard importable."""
    if folder.exists() and not folder.is_dir():
        raise AutotuneError(f"--tensorboard {folder}: that is a file; name a folder")
    load()


def load() -> SimpleNamespace:
    """tensorboard's event writer and the records it writes."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise AutotuneError(MISSING) from None
    return SimpleNamespace(writer=EventFileWriter, event=Event, summary=Summary, text=text_pb)


def scalars(
    tensorboard: SimpleNamespace,
    values: Sequence[tuple[str, float | None]],
    *,
    step: int,
    wall_time: float,
) -> Any:
    """One event holding each (tag, value) with a value."""
    Summary = tensorboard.summary
    summary = Summary(
        value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values if v is not None]
    )
    return tensorboard.event(wall_time=wall_time, step=step, summary=summary)


def write_run(
    tensorboard: SimpleNamespace, run: Path, events: Sequence[Any], *, protected: Iterable[Path]
) -> None:
    """`events` as the one event file of the TensorBoard run `run`, replacing any an earlier
    `--tensorboard` wrote there; never one of the `protected` files."""
    kept = [p for p in protected if p.exists()]
    run.mkdir(parents=True, exist_ok=True)
    for old in run.glob(EVENT_FILE + "*"):  # an earlier --tensorboard's, and only those
        if not any(os.path.samefile(old, own) for own in kept):
            old.unlink()
    writer = tensorboard.writer(str(run))
    for event in events:
        writer.add_event(event)
    writer.close()


def _start(trial: Any) -> float:
    """When the trial began, as seconds since the epoch (0 where the storage did not say)."""
    began = getattr(trial, "datetime_start", None)
    return began.timestamp() if began is not None else 0.0


def _slug(label: str) -> str:
    """`trial 4 in fp32` -> `trial-4-in-fp32`: a folder name TensorBoard shows as it is."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", label).strip("-")
