"""Telemetry: input wait, per-trial peak memory, NVML sampling (absent without a GPU), per-class
figures."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

from autotune.record import classes
from autotune.train import class_figures, telemetry
from autotune.train.config import Limits, TrialConfig
from autotune.train.measure import peak_memory, reset_peak_memory
from autotune.train.tasks import Task
from autotune.train.trial import run
from tests.tasks import _blobs, _mlp, blobs

CPU = torch.device("cpu")
BASE = TrialConfig(
    lr=0.05,
    scheduler="constant",
    batch_size=32,
    accumulation_steps=1,
    num_workers=0,
    prefetch_factor=None,
    pin_memory=False,
    precision="fp32",
)
# accuracy never reaches 2
TWO_EPOCHS = Limits(target=2.0, max_epochs=2, max_seconds=60, eval_every=1.0)


class SlowToLoad(Dataset):
    """The blobs, each sample taking `delay` seconds to load: a training loop over it is
    input-bound."""

    def __init__(self, delay: float) -> None:
        self.data, self.delay = _blobs(256, 0), delay

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        time.sleep(self.delay)
        return self.data[index]


def test_a_loader_that_cannot_keep_up_shows_as_input_wait() -> None:
    slow = run(
        Task(model=_mlp, train=SlowToLoad(0.004), val=_blobs(128, 1)),
        BASE,
        limits=TWO_EPOCHS,
        device=CPU,
        seed=0,
    )
    fast = run(
        Task(model=_mlp, train=_blobs(256, 0), val=_blobs(128, 1)),
        BASE,
        limits=TWO_EPOCHS,
        device=CPU,
        seed=0,
    )
    # 128 ms of sleep per batch against a step of about a millisecond
    assert slow.input_wait_fraction > 0.6
    assert fast.input_wait_fraction < slow.input_wait_fraction
    assert 0 <= fast.input_wait_fraction <= 1


def test_input_wait_counts_the_time_spent_in_next() -> None:
    waiting = telemetry.InputWait()

    def slow():
        for i in range(3):
            time.sleep(0.05)
            yield i

    assert list(waiting.timed(slow())) == [0, 1, 2]
    # at least the sleeps; no upper bound: a loaded machine may take longer
    assert waiting.seconds >= 0.15
    assert telemetry.wait_fraction(1.0, 4.0) == 0.25 and telemetry.wait_fraction(1.0, 0.0) is None


def test_peak_memory_is_the_trials_own_not_the_process_lifetimes() -> None:
    reset_peak_memory(CPU)
    big = torch.ones(64 * 2**20)  # 256 MiB, touched
    big += 1
    del big
    after_big = peak_memory(CPU)
    reset_peak_memory(CPU)
    assert peak_memory(CPU) < after_big - 200 * 2**20


def test_a_trial_records_its_telemetry_and_no_gpu_figures_on_cpu() -> None:
    result = run(blobs(), BASE, limits=TWO_EPOCHS, device=CPU, seed=0)
    assert result.samples_per_second > 0 and result.peak_memory_bytes > 0
    assert result.input_wait_fraction is not None and result.gpu is None
    assert sum(map(sum, result.confusion)) == 512  # every validation sample, once


def test_no_nvml_reader_without_an_nvidia_gpu(capfd: pytest.CaptureFixture[str]) -> None:
    assert telemetry.nvml_reader(CPU) is None
    if not torch.cuda.is_available():  # asking for cuda where there is none: still quietly None
        assert telemetry.nvml_reader(torch.device("cuda")) is None
    assert capfd.readouterr() == ("", "")


def test_the_sampler_reads_in_the_background_until_stopped() -> None:
    readings = iter(
        [(10.0, 2**30, 100_000.0), (30.0, 3 * 2**30, 300_000.0)] + [(20.0, 2**30, 200_000.0)] * 1000
    )
    sampler = telemetry.Sampler(lambda: next(readings), every=0.01).start()
    time.sleep(0.2)
    figures = sampler.stop()
    count = figures["samples"]
    assert count >= 3 and len(sampler.readings) == count
    time.sleep(0.05)
    assert len(sampler.readings) == count  # stopped means stopped
    assert (
        figures["util_max"] == 30.0
        and figures["memory_used_peak_mb"] == 3 * 1024
        and figures["power_max_w"] == 300.0
    )
    assert 10.0 < figures["util_mean"] < 30.0


def test_a_reading_that_fails_ends_sampling_not_the_trial() -> None:
    def broken() -> telemetry.Reading:
        raise RuntimeError("NVML: GPU is lost")

    sampler = telemetry.Sampler(broken, every=0.01).start()
    time.sleep(0.05)
    assert sampler.stop() is None
    assert telemetry.Sampler(None).start().stop() is None


def test_confusion_and_per_class_figures() -> None:
    outputs = torch.tensor([[2.0, 0, 0], [0, 2.0, 0], [0, 2.0, 0], [2.0, 0, 0]])
    targets = torch.tensor([0, 1, 0, 2])
    matrix = class_figures.confusion(outputs, targets)
    assert matrix == [[1, 1, 0], [0, 1, 0], [1, 0, 0]]
    zero, one, two = classes.per_class(matrix)
    assert zero == {"class": 0, "precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert one["precision"] == 0.5 and one["recall"] == 1.0 and one["f1"] == pytest.approx(2 / 3)
    # never predicted
    assert two["precision"] is None and two["recall"] == 0.0 and two["f1"] is None
    assert classes.add([matrix, matrix])[0] == [2, 2, 0]


def test_no_confusion_for_what_is_not_a_classifier() -> None:
    assert class_figures.confusion(torch.randn(4, 1), torch.randn(4)) is None  # regression
    # a label past the outputs
    assert class_figures.confusion(torch.randn(4, 3), torch.tensor([0, 1, 2, 3])) is None
    assert (
        class_figures.confusion(torch.randn(4, 3, 2), torch.zeros(4, 2, dtype=torch.long)) is None
    )


def test_the_text_report_gives_the_winners_figures_and_says_when_it_is_input_bound() -> None:
    from autotune.report import winner

    figures = {
        "samples_per_second": 812.4,
        "input_wait": 0.71,
        "peak_memory_mb": 300.0,
        "gpu": None,
        "runs": 3,
        "source": "confirmation",
    }
    per_class = {
        "runs": 3,
        "source": "confirmation",
        "classes": classes.per_class([[9, 1, 0], [0, 10, 0], [5, 0, 5]]),
    }
    hardware, quality = winner.figure_lines(figures, per_class)
    assert hardware == (
        "Hardware (median of 3 confirmation runs): 812 samples/s after warm-up, 71% of training "
        "time waiting for input (input-bound), peak memory 300 MiB."
    )
    assert "F1 from 0.667 (class 2) to 0.952 (class 1)" in quality
    figures["input_wait"] = 0.2
    assert "input-bound" not in winner.figure_lines(figures, per_class)[0]
