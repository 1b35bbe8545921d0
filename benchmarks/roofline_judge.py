"""The roofline benchmark's judge (benchmarks/roofline.py): each arm's winner, a fixed expert
recipe and the baseline trained by what a user's own trainer runs, not autotune's loop: the
plain-PyTorch module `autotune export --format torch` writes, evaluating off the clock every
`budget.eval_every` epochs, on fresh seeds, the candidates interleaved within each seed. Then,
for each autotune arm with the joint probe, the knob space's limit and the goals.

It reads nothing but the results file (each arm's winner and its probe's figures), so it may run
in another session than the arms did.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import math
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune import export
from autotune.probe.model.figures import limit_for
from autotune.record.summary import Counts, Summary, Winner
from autotune.report.winner import predicted_seconds
from autotune.search.space import Choices, complete
from autotune.spec import study_file
from autotune.study import preparation
from autotune.train import first_steps
from autotune.train.first_steps import FIRST_STEPS
from autotune.train.measure import cpu_count, device_name
from autotune.train.tasks import reference

# The autotune arms with the joint probe: the judge weighs each that ran against the peers and
# its limit (a short GPU session may run `prior` alone).
JOINT_ARMS = ("joint", "prior", "warm")

EXPERT = {
    "precision": "bf16",
    "channels_last": True,
    "cudnn_benchmark": True,
    "pin_memory": True,
    "scheduler": "onecycle",
    "lr": 0.2,
    "accumulation_steps": 1,
    "compile": False,
}


EXPERT_BATCH = 512
JUDGE_SEED = 8_000_000  # far from every seed a study uses
# The baseline's time is context (each arm as x the baseline), no goal's measure, and its runs are
# the judge's longest (about 40 s each on an H200 against 3 to 12 s for an arm's winner): one seed.
BASELINE_SEEDS = 1


def expert(prepared: preparation.Prepared) -> dict[str, Any]:
    """The expert recipe, each knob as the space (fitted to the device) allows it."""
    space = prepared.space
    config = {**prepared.baseline, **EXPERT}
    for knob in (
        "precision",
        "channels_last",
        "cudnn_benchmark",
        "pin_memory",
    ):  # what the device can run
        if config[knob] not in space[knob].values:
            config[knob] = prepared.baseline[knob]
    workers = space["num_workers"]
    most = max(workers.values) if isinstance(workers, Choices) else int(workers.high)
    config["num_workers"] = min(most, cpu_count())
    config["prefetch_factor"] = config.get("prefetch_factor") or 2
    batches = space["batch_size"]
    sizes = (
        batches.values if isinstance(batches, Choices) else [int(batches.low), int(batches.high)]
    )
    config["batch_size"] = max([b for b in sizes if b <= EXPERT_BATCH] or [min(sizes)])
    return complete(config)


def export_template(spec: study_file.StudySpec, prepared: preparation.Prepared) -> Summary:
    """What the plain-PyTorch export reads of a study (its task's optimizer, the device, the
    limits), from the study file as prepared, with a winner whose params the judge replaces: the
    judge reads no arm's storage, so it runs from the results file alone, in a later session too."""
    budget = spec.budget
    return Summary(
        study=spec.name,
        target=spec.target,
        counts=Counts(**{field.name: 0 for field in dataclasses.fields(Counts)}),
        best=Winner(
            trial=None,
            label="judged",
            params=complete(prepared.baseline),
            time_to_target=math.nan,
            metric=math.nan,
            runs=0,
            source="judge",
            epochs=None,
        ),
        limits={
            "max_epochs": budget.max_epochs,
            "max_seconds": budget.max_seconds,
            "eval_every": budget.eval_every,
        },
        optimizer=reference(prepared.task.optimizer),
        device=prepared.device.type,
    )


def judge_run(
    template: Summary,
    config: dict[str, Any],
    prepared: preparation.Prepared,
    spec: study_file.StudySpec,
    seed: int,
    *,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Train `config` with the exported plain-PyTorch module to the target (or `max_steps`
    optimizer steps): its time to target (evaluation off the clock) and the samples it took."""
    winner = dataclasses.replace(template.best, params=dict(config))
    source = export.render(dataclasses.replace(template, best=winner), "torch")
    module = types.ModuleType("exported")
    exec(compile(source, "<export>", "exec"), module.__dict__)
    task, device, budget = prepared.task, prepared.device, spec.budget
    torch.manual_seed(seed)
    model = task.model()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    started, paused = time.perf_counter(), 0.0
    # with data_on_device, the task's own copy on the device, made on the clock as the trial's is
    on_device = config.get("data_on_device") and task.device_train is not None
    training = module.make_training(
        model,
        task.train,
        device=device,
        seed=seed,
        max_epochs=config.get("schedule_epochs") or budget.max_epochs,
        gather=task.device_train(device) if on_device else None,
    )
    per_epoch = len(training.loader) / config["accumulation_steps"]
    every = max(1, round(budget.eval_every * per_epoch))
    samples, reached, metric = 0, False, None
    try:
        for step in range(1, min(training.total_steps, max_steps or training.total_steps) + 1):
            module.train_step(training, loss_fn=task.loss)
            samples += config["batch_size"] * config["accumulation_steps"]
            if step % every == 0 or step == training.total_steps:
                sync()
                pause = time.perf_counter()
                metric = evaluate(training, module, task, device)
                paused += time.perf_counter() - pause
                if metric >= spec.target.value:
                    reached = True
                    break
            if time.perf_counter() - started - paused > budget.max_seconds:
                break
        sync()
        seconds = time.perf_counter() - started - paused
    finally:
        training.batches.close()  # its loader iterator, and so its workers, go now
        del training
        gc.collect()
    return {
        "reached": reached,
        "time_to_target": seconds if reached else None,
        "samples": samples,
        "seconds": seconds,
        "metric": metric,
    }


@functools.cache
def val_batches(val: Any) -> list[Any]:
    """The validation set collated once: the judge evaluates it a dozen times a run."""
    return list(DataLoader(val, batch_size=256))


def evaluate(training: Any, module: Any, task: Any, device: torch.device) -> float:
    training.module.eval()
    outputs, targets = [], []
    with torch.no_grad(), training.autocast():
        for inputs, labels in val_batches(task.val):
            outputs.append(training.module(module.to_device(inputs, device)).float().cpu())
            targets.append(labels)
    training.module.train()
    return float(task.metric(torch.cat(outputs), torch.cat(targets)))


def median_time(runs: list[dict[str, Any]]) -> float:
    """The median time to target, a miss counting as infinitely slow."""
    return statistics.median(r["time_to_target"] if r["reached"] else math.inf for r in runs)


def judge(
    record: dict[str, Any],
    spec_of: Callable[[str], study_file.StudySpec],
    *,
    seeds: int,
    save: Callable[[], None],
    deadline: float | None = None,
) -> None:
    """Each arm's winner and the expert recipe, trained by the export on `seeds` fresh seeds, and
    the baseline on BASELINE_SEEDS of them, interleaved; then the limit and the goals for each of
    JOINT_ARMS that ran. The runs an earlier sitting made on this device of a candidate that is
    unchanged are kept; none starts after `deadline` (time.monotonic()), and the limit and goals
    wait until every run is made."""
    first = next((arm for arm in JOINT_ARMS if arm in record["arms"]), None)
    if first is None:
        raise SystemExit(f"no arm of {', '.join(JOINT_ARMS)} has run: run one of them first")
    unfinished = [arm for arm, found in record["arms"].items() if not found.get("finished", True)]
    if unfinished:
        print(f"judge: not begun, {', '.join(unfinished)} unfinished", flush=True)
        return
    spec = spec_of(first)  # what every arm shares: the task, the target, the limits
    prepared = preparation.prepare(spec)
    template = export_template(spec, prepared)
    candidates = {
        "baseline": complete(prepared.baseline),
        "expert": expert(prepared),
        **{arm: complete(found["params"]) for arm, found in record["arms"].items()},
    }
    device = device_name(prepared.device)
    before = record.get("judge") or {}
    same_device = before.get("device") == device
    runs: dict[str, list[dict[str, Any]]] = {
        name: before["runs"].get(name, [])[:seeds]
        if same_device and before["candidates"].get(name) == config
        else []
        for name, config in candidates.items()
    }
    record["judge"] = {"device": device, "candidates": candidates, "runs": runs}
    for key in ("limit", "goals"):
        record.pop(key, None)
    save()
    plan = to_make({name: len(made) for name, made in runs.items()}, seeds=seeds)
    # A process's first steps (on a GPU, the CUDA libraries: 1 s on an H200), untimed before the
    # first run: else the first run of each sitting would carry them, whichever candidate it is.
    untimed = first_steps.load_much(prepared.device)
    for index, name in plan:
        if deadline is not None and time.monotonic() >= deadline:
            made = sum(map(len, runs.values()))
            print(
                f"judge: {made} of {made + len(plan)} runs made; the same command goes on",
                flush=True,
            )
            return
        plan = plan[1:]
        if untimed:
            baseline, untimed = candidates["baseline"], False
            judge_run(template, baseline, prepared, spec, JUDGE_SEED, max_steps=FIRST_STEPS)
        runs[name].append(judge_run(template, candidates[name], prepared, spec, JUDGE_SEED + index))
        print(f"judge seed {index}: {name} {runs[name][-1]}", flush=True)
        save()
    medians = {name: median_time(r) for name, r in runs.items()}
    record["judge"]["medians"] = medians
    ours = [arm for arm in JOINT_ARMS if arm in record["arms"]]
    record["limit"] = {arm: limit_of(record["arms"][arm], runs[arm]) for arm in ours}
    record["goals"] = {arm: goals_of(arm, record, medians) for arm in ours}
    save()
    for name, value in medians.items():
        print(f"{name:>9}: median {value:.2f} s over {len(runs[name])} seed(s)")
    print(json.dumps(record["goals"], indent=2))


def to_make(made: dict[str, int], *, seeds: int) -> list[tuple[int, str]]:
    """The runs still to make, as (seed index, candidate): seed by seed, the candidates in turn
    within each, each to `seeds` runs but the baseline to BASELINE_SEEDS, those `made` skipped."""
    wanted = {name: BASELINE_SEEDS if name == "baseline" else seeds for name in made}
    return [
        (index, name)
        for index in range(seeds)
        for name in made
        if made[name] <= index < wanted[name]
    ]


def limit_of(arm: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The knob space's limit as the arm's probe predicted it for the samples the arm's winner
    needed (the judge's median): the setting predicted fastest for that many, its one-off costs
    then those samples at its rate (figures.limit_for)."""
    reached = [r["samples"] for r in runs if r["reached"]]
    if not arm.get("probe") or not reached:
        return None
    samples = statistics.median(reached)
    limit = limit_for(arm["probe"], samples)
    if limit is None:
        return None
    return {**limit, "samples": samples, "fixed_seconds": limit["start_up"]}


def goals_of(arm: str, record: dict[str, Any], medians: dict[str, float]) -> dict[str, Any]:
    """One autotune arm against the goals: its judged time beside the best peer's, the limit's and
    the one its report predicts, the GPU time it took to find its winner (probe and trials: plain
    TPE confirms nothing) and its whole study's beside plain TPE's, and its study's length."""
    mine, peers = medians[arm], [medians.get(k, math.inf) for k in ("tpe", "expert")]
    limit, gpu = record["limit"][arm], record["arms"][arm]["gpu_seconds"]
    found = gpu - ((record["arms"][arm].get("time_spent") or {}).get("confirmation") or 0.0)
    tpe = record["arms"].get("tpe", {}).get("gpu_seconds")
    samples = [r["samples"] for r in record["judge"]["runs"][arm] if r["reached"]]
    predicted = predicted_seconds(
        record["arms"][arm].get("probe"),
        record["judge"]["candidates"][arm],
        statistics.median(samples) if samples else None,
    )
    finite = mine is not None and math.isfinite(mine)
    return {
        "vs_best_peer": min(peers) / mine if mine and finite else None,  # >= 1.5
        "vs_limit": mine / limit["seconds"] if limit and finite else None,  # <= 1.15
        # where the winner trained at a setting the probe measured, at a batch it measured it at
        "vs_predicted": mine / predicted if predicted and finite else None,  # within 0.85-1.15
        "found_vs_tpe": found / tpe if tpe else None,  # <= 0.5
        "gpu_vs_tpe": gpu / tpe if tpe else None,  # the same, its confirmation included
        "study_seconds": gpu,  # < 360 on an H100
    }
