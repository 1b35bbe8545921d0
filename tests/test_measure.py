from __future__ import annotations

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
