"""`autotune dashboard STUDY`: optuna-dashboard on the study's storage, to watch or browse it.

optuna-dashboard is an optional extra (`pip install 'autotune[dashboard]'`): a server for a
browser is not something every training machine wants installed.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import Any

from autotune.errors import AutotuneError
from autotune.spec.study_file import StudySpec
from autotune.storage import opening


def _run_server() -> Callable[..., None]:
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise AutotuneError(
            "autotune dashboard needs optuna-dashboard, which is not installed: "
            "pip install 'autotune[dashboard]' (or pip install optuna-dashboard)"
        ) from None
    return run_server


def url(host: str, port: int) -> str:
    # an IPv6 address goes in brackets
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(spec: StudySpec, *, host: str, port: int) -> None:
    """Serve the dashboard until Ctrl-C, which ends it with KeyboardInterrupt.

    The storage is opened as `autotune report` opens it, so a missing database or study is the
    same one-line error, and nothing is created.
    """
    run_server = _run_server()
    opening.open_study(spec, create=False)  # raises StorageError when there is nothing to show
    store: Any = opening.make_storage(spec, create=False)
    _check_free(host, port)  # before anything says it serves there
    # Ctrl-C ends it, also where it was started with SIGINT ignored or blocked (a script's
    # background job, a parent that blocked it): both are inherited.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(
        f"autotune: dashboard of study {spec.name!r} in {spec.storage} at {url(host, port)} "
        "(Ctrl-C to stop)",
        flush=True,
    )
    try:
        run_server(store, host=host, port=port)
    except OSError as exc:  # taken since the check
        raise _cannot_serve(host, port, exc) from None
    # run_server serves until interrupted, and its server (bottle) swallows the KeyboardInterrupt:
    # returning means Ctrl-C stopped it.
    raise KeyboardInterrupt


def _check_free(host: str, port: int) -> None:
    """Refuse a port that is taken, or a host that is not an address of this machine, as the
    server would bind it (wsgiref reuses addresses left in TIME_WAIT)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:  # socket.gaierror among them: a host name that resolves to nothing
        raise _cannot_serve(host, port, exc) from None


def _cannot_serve(host: str, port: int, exc: OSError) -> AutotuneError:
    return AutotuneError(
        f"cannot serve the dashboard at {host}:{port} ({exc.strerror or exc}); "
        f"choose another --port or --host"
    )
