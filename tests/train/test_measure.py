from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from autotune.train import measure
from autotune.train.measure import Clock, cpu_count, threads_for


def test_clock_counts_only_while_running() -> None:
    clock = Clock(torch.device("cpu"))
    clock.start()
    time.sleep(0.05)
    first = clock.stop()
    time.sleep(0.2)  # paused: not counted
    assert clock.read() == first and not clock.running
    clock.start()
    time.sleep(0.05)
    total = clock.stop()
    assert 0.1 <= total < 0.2 + 0.1


def test_clock_synchronizes_cuda_before_each_measured_read(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    device = torch.device("cuda", 0)
    clock = Clock(device)
    clock.start()
    clock.read()
    clock.read(sync=False)  # limit checks must not stall the GPU every step
    clock.stop()
    assert calls == [device, device, device]


def test_threads_leave_the_workers_their_cores() -> None:
    assert threads_for(0) == cpu_count()
    assert threads_for(cpu_count() + 3) == 1


def test_cpu_peak_memory_and_name() -> None:
    assert measure.peak_memory(torch.device("cpu")) > 10 * 2**20  # torch alone takes more
    assert measure.device_name(torch.device("cpu")).startswith("cpu (")


def _spin_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _ambient(seconds: float) -> float:
    with measure.other_load() as load:
        time.sleep(seconds)
    assert load.cores is not None
    return load.cores


@pytest.mark.skipif(
    not os.path.exists("/proc/stat"), reason="other processes' load is read from Linux's /proc"
)
def test_other_load_sees_another_process_busy_and_not_this_process_or_its_children() -> None:
    ambient = _ambient(1.0)
    if ambient > cpu_count() - 1.2:
        pytest.skip(
            f"other processes already keep {ambient:.1f} of {cpu_count()} cores busy: "
            "no core left to load"
        )
    # Another process: started through a shell that exits at once, so it is no descendant of ours.
    shell = subprocess.run(
        ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    other = int(shell.stdout.strip())
    try:
        time.sleep(0.2)  # running
        with measure.other_load() as load:
            time.sleep(1.5)
    finally:
        os.kill(other, signal.SIGKILL)
    assert load.cores is not None and load.cores - ambient > 0.6, (load.cores, ambient)

    # This process and its children (a child spinning throughout, and one waited for inside) are its
    # own.
    child = multiprocessing.get_context("spawn").Process(target=_spin_for, args=(2.5,))
    child.start()
    try:
        time.sleep(0.5)
        with measure.other_load() as own:
            _spin_for(0.5)
            short = multiprocessing.get_context("spawn").Process(target=_spin_for, args=(0.3,))
            short.start()
            short.join()
            time.sleep(0.5)
    finally:
        child.join()
    assert own.cores is not None and own.cores - ambient < 0.4, (own.cores, ambient)
