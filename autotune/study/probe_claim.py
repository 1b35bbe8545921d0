"""One measurement of a study's systems (its probe) where several machines
begin it on a database server: the run that measures marks the study with its worker (host:pid)
and renews the mark every heartbeat; a run that finds a live mark waits for those figures instead
of measuring the same (minutes of GPU on each machine). Two runs that find no mark in the same
instant both write one and only the later write stands, so a run reads its mark back before it
measures (`claim`). A mark not renewed for the heartbeat's grace period is a dead process's: the
run that finds it measures itself. A local file needs none of this: one run holds its lock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from autotune import progress, signals
from autotune.record import schema
from autotune.storage import opening

POLL_SECONDS = 1.0  # how often a waiting run reads the study
# the trials' heartbeat and grace period (AUTOTUNE_HEARTBEAT), for the probe's mark too
RENEW_SECONDS, STALE_SECONDS = opening.HEARTBEAT_SECONDS, opening.GRACE_SECONDS
# how long a run's mark must stand before the run measures: longer than two runs' writes of
# their marks can lie apart once both found none
CLAIM_SECONDS = 1.0


def claim(study: Any) -> bool:
    """Mark the study as measured by this process; whether the mark still is this process's
    CLAIM_SECONDS later. Where another run wrote its own meanwhile, that run measures, and this
    one waits for its figures (`wait_for_another`)."""
    me = opening.worker_id()
    schema.record_probing(study, {"worker": me, "at": time.time()})
    with signals.interruptible():
        time.sleep(CLAIM_SECONDS)
    return schema.probing(study.user_attrs).get("worker") == me


@contextlib.contextmanager
def marked(study: Any) -> Iterator[None]:
    """The study marked as measured by this process, the mark renewed every heartbeat, while the
    block runs; cleared after it, however it ends."""
    me = opening.worker_id()
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(RENEW_SECONDS):
            try:
                schema.record_probing(study, {"worker": me, "at": time.time()})
            except Exception:  # noqa: BLE001 - the server out of reach a moment: the mark may
                continue  # go stale (another machine then measures too) until a renewal lands

    schema.record_probing(study, {"worker": me, "at": time.time()})
    beat = threading.Thread(target=renew, name="autotune-probe-mark", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        with signals.writing():
            schema.record_probing(study, {})


def wait_for_another(study: Any) -> None:
    """While another process's mark is live, wait for it to be cleared (its figures stored). A
    mark is live while it changes: each machine judges it by its own clock, as clocks differ."""
    seen, since, told = None, time.monotonic(), False
    with signals.interruptible():
        while True:
            mark = schema.probing(study.user_attrs)
            if not mark or mark["worker"] == opening.worker_id():
                return
            if mark != seen:
                seen, since = mark, time.monotonic()
            elif time.monotonic() - since > STALE_SECONDS:
                progress.say(
                    f"autotune: {mark['worker']} stopped renewing its systems probe's mark; "
                    "this run probes instead"
                )
                return
            if not told:
                progress.say(
                    f"autotune: {mark['worker']} is measuring this study's systems; this run "
                    "waits for its figures rather than measure the same"
                )
                told = True
            time.sleep(POLL_SECONDS)
