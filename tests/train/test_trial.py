from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

import autotune
from autotune.search.knob import PRECISIONS
from autotune.train.config import Diverged, Limits, TrialConfig
from autotune.train.loader import make_loader
from autotune.train.tasks import Task, takes
from autotune.train.training import DTYPES, make_scheduler, train_step
from autotune.train.trial import FINITE_CHECK_EVERY, LossWatch, run
from tests.tasks import blobs, nan_metric

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
EASY = Limits(target=0.9, max_epochs=20, max_seconds=60, eval_every=0.25)
NEVER = Limits(target=2.0, max_epochs=2, max_seconds=60, eval_every=0.5)  # accuracy never reaches 2


def step_with(
    model: nn.Module, micro_batches: list, *, scaler_on: bool = False, dtype=torch.float32
) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_step(
        model,
        micro_batches,
        loss_fn=nn.functional.cross_entropy,
        optimizer=optimizer,
        scaler=torch.amp.GradScaler("cpu", enabled=scaler_on),
        autocast=functools.partial(
            torch.autocast, "cpu", dtype=dtype, enabled=dtype != torch.float32
        ),
        device=CPU,
        non_blocking=False,
    )


@pytest.mark.parametrize("batch, steps", [(8, 4), (16, 2), (4, 8)])
def test_accumulation_matches_one_large_batch(batch: int, steps: int) -> None:
    torch.manual_seed(0)
    inputs, targets = torch.randn(batch * steps, 8), torch.randint(0, 4, (batch * steps,))
    small = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    large = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    large.load_state_dict(small.state_dict())
    before = [p.detach().clone() for p in small.parameters()]

    step_with(small, list(zip(inputs.split(batch), targets.split(batch))))
    step_with(large, [(inputs, targets)])

    for p_small, p_large, p_before in zip(small.parameters(), large.parameters(), before):
        assert not torch.equal(p_small, p_before)  # the step did something
        torch.testing.assert_close(p_small, p_large, rtol=1e-5, atol=1e-6)


def test_fp16_with_grad_scaler_takes_a_scaled_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    before = model.weight.detach().clone()
    step_with(
        model,
        [(torch.randn(16, 8), torch.randint(0, 4, (16,)))],
        scaler_on=True,
        dtype=torch.float16,
    )
    assert torch.isfinite(model.weight).all() and not torch.equal(model.weight, before)


def test_reaches_the_target_and_records_every_figure() -> None:
    result = run(blobs(), BASE, limits=EASY, device=CPU, seed=1)
    assert result.reached and result.stop_reason == "target"
    assert result.time_to_target == result.train_seconds > 0
    assert result.best_metric >= 0.9 and result.curve[-1][2] == result.best_metric
    assert result.optimizer_steps > 0 and result.epochs > 0
    assert result.samples_per_second is None or result.samples_per_second > 0
    assert result.peak_memory_bytes > 0 and result.device_name.startswith("cpu")
    assert result.torch_version == torch.__version__
    # it stopped at that evaluation
    assert result.samples_to_target == round(result.epochs * len(blobs().train))


def test_a_trial_that_misses_the_target_says_how_far_it_got() -> None:
    result = run(blobs(), BASE, limits=NEVER, device=CPU, seed=1)
    assert not result.reached and result.time_to_target is None
    assert result.stop_reason == "max_epochs"
    assert result.epochs == pytest.approx(2 * (1024 // 32) * 32 / 1024)
    assert result.best_metric == max(m for _, _, m in result.curve) > 0.5
    # every eval_every epochs
    assert [round(e, 6) for _, e, _ in result.curve] == [
        0.5,
        1.0,
        1.5,
        2.0,
    ]


def test_time_limit_stops_the_trial() -> None:
    limits = dataclasses.replace(NEVER, max_epochs=10_000, max_seconds=0.2)
    result = run(blobs(), BASE, limits=limits, device=CPU, seed=1)
    assert result.stop_reason == "max_seconds" and 0.2 <= result.train_seconds < 5


def test_a_process_s_first_steps_are_on_no_trial_s_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process's first steps load (on a GPU the CUDA libraries: 1 s on an H200) is the
    process's cost, not the configuration's: taken before the clock, once a process, so that a
    trial in a fresh process is timed as one in a warm process is."""
    from autotune.train import first_steps
    from autotune.train.tasks import paced

    def paced_task():
        return paced.make(load_seconds=0.05e-3, compute_seconds=0.05e-3, first_step_seconds=1.0)

    monkeypatch.setattr(first_steps, "_taken", set())  # as in a fresh process
    limits = dataclasses.replace(NEVER, max_epochs=0.5)
    config = dataclasses.replace(BASE, batch_size=64, precision="bf16", num_workers=2)
    config = dataclasses.replace(config, prefetch_factor=2)
    # on a CPU they load next to nothing: the task's code runs once, its first step on the clock
    assert run(paced_task(), config, limits=limits, device=CPU, seed=1).train_seconds > 1.0
    # where they load much (a GPU's, here the paced task's 1 s wait)
    monkeypatch.setattr(first_steps, "load_much", lambda device: True)
    task = paced_task()
    fresh = run(task, config, limits=limits, device=CPU, seed=1)
    assert task.model().first_use == {}  # paid: the task's first step waited its second
    warm = run(task, config, limits=limits, device=CPU, seed=1)
    # the 1 s wait is on neither clock: the fresh run took what the warm one did, not 1 s more
    assert fresh.train_seconds < warm.train_seconds + 0.5, (fresh, warm)
    # ... and the trial trains as it would have: the same losses and metrics at every evaluation
    assert fresh.train_loss == warm.train_loss
    assert [point[1:] for point in fresh.curve] == [point[1:] for point in warm.curve]


def test_evaluation_runs_on_a_paused_clock_and_its_time_is_recorded() -> None:
    task = blobs()
    pause = 0.2

    def slow_metric(outputs: torch.Tensor, targets: torch.Tensor) -> float:
        time.sleep(pause)
        return task.metric(outputs, targets)

    slow = dataclasses.replace(task, metric=slow_metric)
    started = time.perf_counter()
    told: list[float] = []
    result = run(
        slow,
        BASE,
        limits=dataclasses.replace(NEVER, eval_every=0.25),
        device=CPU,
        seed=1,
        progress=lambda steps, total, metric, seconds, paused: told.append(paused),
    )
    wall = time.perf_counter() - started
    assert len(result.curve) == 8
    assert wall - result.train_seconds >= pause * len(result.curve)
    # the time off the clock: every evaluation's, and no training
    assert pause * len(result.curve) <= result.paused_seconds <= wall - result.train_seconds
    # progress tells it as it grows (what a trial stopped midway stores): every evaluation's
    # before the last, after which the run ends without another word
    assert told == sorted(told) and told[0] < pause
    assert pause * (len(result.curve) - 1) <= told[-1] <= result.paused_seconds


def recording_optimizers() -> tuple[Task, list[torch.optim.Optimizer]]:
    """The blobs task with a plain SGD factory that keeps every optimizer it builds."""
    optimizers: list[torch.optim.Optimizer] = []

    def optimizer(params, lr: float) -> torch.optim.Optimizer:
        optimizers.append(torch.optim.SGD(params, lr=lr))
        return optimizers[-1]

    return dataclasses.replace(blobs(), optimizer=optimizer), optimizers


def test_scheduler_steps_once_per_optimizer_step() -> None:
    """A cosine schedule ends at zero exactly when the trial's last optimizer step is taken."""
    task, optimizers = recording_optimizers()
    config = dataclasses.replace(BASE, scheduler="cosine", batch_size=16, accumulation_steps=4)
    result = run(task, config, limits=NEVER, device=CPU, seed=1)
    assert result.optimizer_steps == 2 * (1024 // 16) // 4
    assert optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 20])
@pytest.mark.parametrize("name", ["constant", "step", "cosine", "onecycle"])
def test_every_schedule_survives_its_whole_budget(name: str, total: int) -> None:
    """Also the tiny budgets of a short trial with a large effective batch (OneCycleLR divided by
    zero at 4 steps)."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = make_scheduler(name, optimizer, total_steps=total, lr=0.1)
    for _ in range(total):
        optimizer.step()
        scheduler.step()
        assert 0 <= optimizer.param_groups[0]["lr"] <= 0.1 + 1e-12


def test_each_precision_autocasts_to_a_dtype_as_wide_as_the_table_says() -> None:
    """The search layer names the dtypes (it imports no torch) and sizes memory by their bytes."""
    for name, precision in PRECISIONS.items():
        assert (
            DTYPES[name] is getattr(torch, precision.dtype)
            and DTYPES[name].itemsize == precision.bytes
        ), name
    assert DTYPES == {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def test_same_seed_same_curve_and_different_seed_differs() -> None:
    first = run(blobs(), BASE, limits=NEVER, device=CPU, seed=3)
    again = run(blobs(), BASE, limits=NEVER, device=CPU, seed=3)
    other = run(blobs(), BASE, limits=NEVER, device=CPU, seed=4)
    assert [m for *_, m in first.curve] == [m for *_, m in again.curve]
    assert [m for *_, m in first.curve] != [m for *_, m in other.curve]


def test_loader_follows_the_knobs() -> None:
    data = blobs().train
    plain = make_loader(data, BASE, seed=0, device=CPU)
    assert plain.num_workers == 0 and plain.prefetch_factor is None and not plain.pin_memory
    workers = make_loader(
        data,
        dataclasses.replace(BASE, num_workers=2, prefetch_factor=4, pin_memory=True),
        seed=0,
        device=CPU,
    )
    assert workers.num_workers == 2 and workers.prefetch_factor == 4 and workers.persistent_workers
    assert not workers.pin_memory  # pinning is only for CUDA copies


class Rolled(torch.utils.data.Dataset):
    """A user's keyed dataset, as the reference shows one: each sample rolled by a random shift."""

    keyed = True

    def __init__(self) -> None:
        self.images, self.labels = (
            torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8),
            torch.arange(64) % 3,
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item):
        index, rng = autotune.augmentation_rng(item)
        shift = int(torch.randint(-2, 3, (), generator=rng))
        return self.images[index].roll(shift, dims=-1), self.labels[index]


def test_a_keyed_dataset_gets_the_same_batches_whatever_the_loader_settings() -> None:
    def batches(**knobs) -> list[torch.Tensor]:
        loader = make_loader(
            Rolled(), dataclasses.replace(BASE, batch_size=8, **knobs), seed=5, device=CPU
        )
        return [x for x, _ in itertools.islice(loader, len(loader))]  # one epoch

    in_main = batches()
    # some rows rolled
    assert len(in_main) == 8 and any(bool((x.diff(dim=-1) < 0).any()) for x in in_main)
    assert all(
        torch.equal(a, b) for a, b in zip(in_main, batches(num_workers=2, prefetch_factor=2))
    )
    # plain indices: global random numbers
    plain = next(iter(torch.utils.data.DataLoader(Rolled(), batch_size=8)))
    assert plain[0].shape == (8, 8)


def test_worker_processes_train_to_the_target() -> None:
    config = dataclasses.replace(BASE, num_workers=1, prefetch_factor=2)
    assert run(blobs(), config, limits=EASY, device=CPU, seed=1).reached


def test_bf16_autocast_trains_on_cpu() -> None:
    config = dataclasses.replace(BASE, precision="bf16")
    assert run(blobs(), config, limits=EASY, device=CPU, seed=1).reached


def test_an_effective_batch_larger_than_the_data_is_refused() -> None:
    config = dataclasses.replace(BASE, batch_size=512, accumulation_steps=4)
    with pytest.raises(ValueError, match="larger than the 1024 training samples"):
        run(blobs(), config, limits=EASY, device=CPU, seed=1)


def test_params_reach_the_model_factory_and_the_optimizer_that_name_them() -> None:
    """Each parameter goes to whichever of the two asks for it by name; defaults stay otherwise."""
    seen: dict[str, object] = {}

    def model(width: int, act: str = "relu") -> nn.Module:
        seen["model"] = (width, act)
        return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))

    def optimizer(parameters, lr: float, *, weight_decay: float) -> torch.optim.Optimizer:
        seen["optimizer"] = (lr, weight_decay)
        return torch.optim.SGD(parameters, lr=lr, weight_decay=weight_decay)

    data = blobs()
    task = Task(model=model, optimizer=optimizer, train=data.train, val=data.val)
    config = dataclasses.replace(BASE, params=(("width", 16), ("weight_decay", 1e-4)))
    result = run(task, config, limits=NEVER, device=CPU, seed=0)
    assert seen == {"model": (16, "relu"), "optimizer": (0.05, 1e-4)}
    assert result.optimizer_steps > 0
    assert config.as_dict()["width"] == 16 and TrialConfig.from_mapping(config.as_dict()) == config
    assert task.unused(["width", "weight_decay", "act", "depth"]) == ["depth"]


def test_takes_hands_everything_to_kwargs_and_nothing_to_the_positional_arguments() -> None:
    def flexible(parameters, lr, **options):
        return None

    params = {"parameters": 1, "lr": 2, "width": 3}
    assert takes(flexible, {"width": 3, "depth": 4}, after=2) == {"width": 3, "depth": 4}
    assert takes(lambda parameters, lr, width=1: None, params, after=2) == {"width": 3}
    assert takes(lambda parameters, lr, width=1: None, params) == params


def test_a_fixed_schedule_trains_past_the_target_to_its_end_and_notes_when_it_crossed() -> None:
    """stop_at_target off (the fixed_schedule objective): the run takes every step of its schedule;
    time_to_target is still the first evaluation that reached the target."""
    limits = dataclasses.replace(EASY, max_epochs=3, stop_at_target=False)
    result = run(blobs(), BASE, limits=limits, device=CPU, seed=1)
    assert result.stop_reason == "max_epochs" and result.optimizer_steps == 3 * (1024 // 32)
    assert result.reached and 0 < result.time_to_target < result.train_seconds
    crossing = next(seconds for seconds, _, metric in result.curve if metric >= 0.9)
    assert result.time_to_target == crossing
    assert result.final_metric == result.curve[-1][2]
    crossed_at = next(epochs for _, epochs, metric in result.curve if metric >= 0.9)
    assert result.samples_to_target == round(crossed_at * 1024) < 3 * 1024


def test_samples_to_target_stay_the_same_on_a_loaded_machine() -> None:
    """The samples a run needs are the maths' (configuration and seed), not the machine's: with
    every core kept busy by other processes, the same run needs the same samples, to the sample."""
    limits = dataclasses.replace(EASY, target=0.95)
    config = dataclasses.replace(BASE, lr=0.01)  # slow enough to need several evaluations
    quiet = run(blobs(), config, limits=limits, device=CPU, seed=5)
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        time.sleep(0.5)  # the spinners are running before the run starts
        loaded = run(blobs(), config, limits=limits, device=CPU, seed=5)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert quiet.reached and len(quiet.curve) >= 3
    assert loaded.samples_to_target == quiet.samples_to_target
    assert [m for *_, m in loaded.curve] == [m for *_, m in quiet.curve]


def test_schedule_epochs_sets_the_schedules_length_and_the_runs() -> None:
    """A 1-epoch cosine schedule ends at zero after one epoch's steps, under a 2-epoch limit."""
    task, optimizers = recording_optimizers()
    config = dataclasses.replace(BASE, scheduler="cosine", schedule_epochs=1.0)
    result = run(task, config, limits=NEVER, device=CPU, seed=1)
    assert result.optimizer_steps == 1024 // 32 and result.stop_reason == "max_epochs"
    assert optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)


def test_max_epochs_cuts_a_longer_schedule_short() -> None:
    """The probe's short runs: a schedule of 8 epochs stopped by a limit of half an epoch."""
    config = dataclasses.replace(BASE, scheduler="cosine", schedule_epochs=8.0)
    result = run(
        blobs(), config, limits=dataclasses.replace(NEVER, max_epochs=0.5), device=CPU, seed=1
    )
    assert result.optimizer_steps == 1024 // 32 // 2


def test_a_diverging_run_stops_within_a_few_steps_of_its_first_non_finite_loss() -> None:
    seen: list[int] = []
    with pytest.raises(Diverged) as info:
        run(
            blobs(),
            dataclasses.replace(BASE, lr=1e12),
            limits=NEVER,
            device=CPU,
            seed=0,
            progress=lambda steps, total, metric, seconds, paused: seen.append(steps),
        )
    match = re.fullmatch(
        r"loss became (nan|inf) at step (\d+) \(epoch (\d+\.\d\d)\): "
        r"the learning rate is likely too high",
        str(info.value),
    )
    assert match, str(info.value)
    step = int(match.group(2))
    assert 1 < step < 16 and float(match.group(3)) == round(step / 32, 2)  # 32 steps an epoch
    # stopped at the next look, far before its 64 steps
    assert max(seen) < step + FINITE_CHECK_EVERY


def test_the_finite_loss_watch_names_the_first_bad_step_and_its_value() -> None:
    watch = LossWatch(CPU)
    for step, loss in enumerate([2.0, 1.5, float("inf"), float("nan"), 1.0], start=1):
        watch.see(torch.tensor(loss), step)
    watch_ok = LossWatch(CPU)
    watch_ok.see(torch.tensor(0.5), 1)
    watch_ok.check(steps_per_epoch=10)  # finite: nothing raised
    with pytest.raises(Diverged, match=r"^loss became inf at step 3 \(epoch 0\.30\)"):
        watch.check(steps_per_epoch=10)


def test_a_non_finite_metric_ends_the_run() -> None:
    with pytest.raises(Diverged, match=r"^metric is nan at epoch 0\.50: "):
        run(nan_metric(), BASE, limits=NEVER, device=CPU, seed=0)
