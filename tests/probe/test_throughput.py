"""Throughput measured apart from what a run learns (autotune/probe/throughput.py)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from autotune.probe import throughput
from autotune.train.config import TrialConfig
from tests.tasks import OOM_BATCH, blobs, cuda_oom

CPU = torch.device("cpu")
BASE = TrialConfig(
    lr=0.05,
    scheduler="onecycle",
    batch_size=16,
    accumulation_steps=1,
    num_workers=0,
    prefetch_factor=None,
    pin_memory=False,
    precision="fp32",
    schedule_epochs=0.5,
)


def test_spread_is_the_interquartile_range_over_the_median() -> None:
    assert throughput.spread([10.0, 10.0, 10.0]) == 0.0
    assert throughput.spread([8.0, 10.0, 12.0]) == pytest.approx(0.2)  # quartiles 9 and 11
    assert throughput.spread([5.0]) == float("inf")


def test_rounds_take_every_configuration_in_the_same_order_until_all_agree() -> None:
    calls: list[str] = []
    noisy = itertools.cycle([100.0, 100.0, 150.0, 60.0])  # settles only once it has enough windows

    def window(name: str, values: itertools.cycle) -> float:
        calls.append(name)
        return next(values)

    figures = throughput.interleave(
        {
            "steady": lambda: window("steady", itertools.repeat(50.0)),
            "noisy": lambda: window("noisy", noisy),
        },
        max_rounds=30,
        max_spread=0.1,
    )
    rounds = len(calls) // 2
    assert calls == ["steady", "noisy"] * rounds  # interleaved: drift falls on both alike
    assert figures["steady"] == [50.0] * rounds
    assert throughput.spread(figures["noisy"]) <= 0.1 or rounds == 30
    assert rounds > throughput.MIN_WINDOWS  # the noisy one kept the rounds going


def test_rounds_stop_at_the_cap_and_skip_windows_that_held_an_epochs_first_batch() -> None:
    every_other = itertools.cycle([None, 10.0])
    wild = itertools.cycle([1.0, 100.0])
    figures = throughput.interleave(
        {"half": lambda: next(every_other), "wild": lambda: next(wild)}, max_rounds=8
    )
    # never agreed: stopped at the cap
    assert figures["half"] == [10.0] * 4 and len(figures["wild"]) == 8


@pytest.mark.skipif(
    not os.path.exists("/proc/stat"), reason="other processes' load is read from Linux's /proc"
)
def test_windows_that_disagree_while_other_processes_keep_the_cores_busy_stop_sooner() -> None:
    """Two processes of another job spinning (no descendants of this one): windows that never
    agree end after BUSY_ROUNDS rounds, not MAX_ROUNDS; more would not settle them."""
    spin = f"import os\nwhile os.path.exists('/proc/{os.getpid()}'): pass"
    others = [
        int(
            subprocess.run(
                ["sh", "-c", f"'{sys.executable}' -c \"$0\" >/dev/null 2>&1 & echo $!", spin],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for _ in range(2)
    ]

    def window(values: itertools.cycle) -> float:
        time.sleep(0.1)  # a window takes time, as a real one does: the load is read after 1 s
        return next(values)

    wild = {key: itertools.cycle([1.0, 100.0]) for key in "ab"}
    try:
        figures = throughput.interleave(
            {key: lambda key=key: window(wild[key]) for key in "ab"}, max_rounds=20
        )
    finally:
        for pid in others:
            os.kill(pid, signal.SIGKILL)
    assert len(figures["a"]) == len(figures["b"]) == throughput.BUSY_ROUNDS


def test_a_steady_configuration_stops_after_the_fewest_windows() -> None:
    assert throughput.interleave({"a": lambda: 5.0}) == {"a": [5.0] * throughput.MIN_WINDOWS}


def test_real_training_gives_each_configuration_a_speed_and_its_start_up_apart() -> None:
    configs = {16: BASE, 64: dataclasses.replace(BASE, batch_size=64)}
    measured = throughput.measure(
        blobs(), configs, device=CPU, seed=0, window_steps=4, max_rounds=6
    )
    assert set(measured) == {16, 64}
    for batch, figure in measured.items():
        assert figure.samples_per_second > 0 and figure.windows >= 1 and not figure.oom
        # three warm-up steps
        assert figure.startup_seconds > 0 and figure.warmup_samples == 3 * batch
        assert 0 <= figure.fixed_seconds <= figure.startup_seconds


@pytest.mark.parametrize("batch", [256, 512, 1024])  # 4, 2 and 1 steps an epoch of the 1024 samples
def test_a_batch_that_makes_epochs_shorter_than_a_window_still_gets_a_speed(batch: int) -> None:
    measured = throughput.measure(
        blobs(),
        {batch: dataclasses.replace(BASE, batch_size=batch)},
        device=CPU,
        seed=0,
        max_rounds=6,
    )
    figure = measured[batch]
    assert figure.samples_per_second > 0 and figure.windows >= 1, figure.reason
    # windows across an epoch's start count: the loader's workers run on across it
    assert figure.window_steps == throughput.WINDOW_STEPS


def test_running_out_of_memory_is_a_result_and_the_others_are_still_measured() -> None:
    configs = {"small": BASE, "large": dataclasses.replace(BASE, batch_size=OOM_BATCH)}
    measured = throughput.measure(
        cuda_oom(), configs, device=CPU, seed=0, window_steps=2, max_rounds=3
    )
    assert measured["large"].oom and measured["large"].samples_per_second is None
    assert "out of memory" in measured["large"].reason.lower()
    assert not measured["small"].oom and measured["small"].samples_per_second > 0
