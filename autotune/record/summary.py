"""What a study found, as typed values: the Summary that every report and export is made from.

report/summarize.py makes it from the storage; report/text.py, report/html_page.py and export/
read it; `as_dict()` is `autotune report --json`. It imports neither pandas, torch nor Optuna, so
the exports can take it without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.spec.sections import Target
from autotune.spec.study_file import FIXED_SCHEDULE, TIME_TO_TARGET

BUSY_CORES = 0.25  # other processes' average use of the cores, above which a measurement says so
LOAD_MOVED = 0.5  # cores: load that moved this much between trials made their times incomparable


@dataclasses.dataclass(frozen=True)
class Counts:
    """Trials by outcome (report/results.counts). `failed` excludes interrupted trials, which are
    retried."""

    total: int
    complete: int
    feasible: int
    pruned: int
    oom: int
    oom_bound: int  # pruned without running: a smaller one ran out of memory
    too_large: int  # pruned without running: its effective batch is larger than the training set
    diverged: int
    past_incumbent: int  # stopped once they could no longer beat the best time
    failed: int
    interrupted: int
    running: int


@dataclasses.dataclass(frozen=True)
class Winner:
    """The configuration to use: the study's fastest trial, or what won the confirmation on fresh
    seeds (a trial, or the baseline when none beat it).

    `time_to_target` is its study time (a mean over its runs) or, confirmed, its median over the
    fresh seeds, with `min`/`max` of the runs that reached the target and `reached` of `runs`;
    None for a baseline kept though it missed the target on most of its fresh seeds.
    """

    trial: int | None  # None: the baseline
    label: str
    params: Mapping[str, Any]
    time_to_target: float | None
    metric: float
    runs: int
    source: str  # "confirmed", "single run", "mean of 3 runs", ... (", not confirmed" when stale)
    epochs: float | None  # of the study's own run of it
    min: float | None = None
    max: float | None = None
    reached: int | None = None  # confirmed only
    telemetry: Mapping[str, Any] | None = None  # report/winner.telemetry
    per_class: Mapping[str, Any] | None = None  # report/winner.pooled_per_class
    # training samples to the target: the median of its confirmation runs that reached it, else
    # its trial's first run's; None where no run counted them
    samples_to_target: float | None = None

    @property
    def is_baseline(self) -> bool:
        return self.trial is None

    @property
    def confirmed(self) -> bool:
        return self.source == "confirmed"

    def as_dict(self) -> dict[str, Any]:
        reached = {} if self.reached is None else {"reached": self.reached}
        return {
            "trial": self.trial,
            "label": self.label,
            "params": dict(self.params),
            "time_to_target": self.time_to_target,
            "metric": self.metric,
            "runs": self.runs,
            **reached,
            "min": self.min,
            "max": self.max,
            "source": self.source,
            "epochs": self.epochs,
            "telemetry": _plain_mapping(self.telemetry),
            "per_class": _plain_mapping(self.per_class),
            **(
                {}
                if self.samples_to_target is None
                else {"samples_to_target": self.samples_to_target}
            ),
        }


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The user's baseline on the confirmation's fresh seeds: median time (None when it missed
    the target in most runs), and the spread of the runs that reached it."""

    params: Mapping[str, Any]
    time_to_target: float | None
    runs: int
    reached: int
    min: float | None
    max: float | None
    # where the runs that missed the target stopped: max_seconds, max_epochs
    missed_at: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "params": dict(self.params),
            "missed_at": list(self.missed_at),
        }

    def why_missed(self, limits: Mapping[str, Any] | None) -> str:
        """Why its runs that missed the target did, and what to change:
        `` (each stopped at ...)``."""
        limits = limits or {}
        if "max_seconds" in self.missed_at:
            seconds = limits.get("max_seconds")
            at = f" ({seconds:g} s)" if isinstance(seconds, (int, float)) else ""
            return (
                f": {self._the_missed()} stopped at budget.max_seconds{at} first, "
                "so it has no time to compare with; "
                "raise budget.max_seconds (a busy machine trains slower) and run again"
            )
        if "max_epochs" in self.missed_at:
            epochs = limits.get("max_epochs")
            at = f" ({epochs:g})" if isinstance(epochs, (int, float)) else ""
            return (
                f": {self._the_missed()} trained all of budget.max_epochs{at} short of it, "
                "so it has no time to compare with; "
                "raise budget.max_epochs, or give a baseline that reaches the target"
            )
        return ""

    def _the_missed(self) -> str:
        if self.reached == 0:
            return "its run" if self.runs == 1 else "its runs"
        return "the other" if self.runs - self.reached == 1 else "the others"


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The re-measurement on fresh seeds: per label (`baseline`, `trial N`), confirm.summarize's
    figures (median, min, max, runs, reached; mean_final_metric under fixed_schedule)."""

    seeds: tuple[int, ...]
    after_trials: int
    configs: Mapping[str, Mapping[str, Any]]
    # goodput: label -> the search's predicted time
    predicted: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # confirm.baseline: until_resolved: the ratio that told the baseline apart
    baseline_resolved_by: float | None = None
    # confirm.precision: the fastest trial's samples to target over its fp32 twin's
    # (verdict.precision_effect)
    precision_effect: Mapping[str, Any] | None = None
    kept_runs: int = 0  # runs taken from a run of the confirmation that was cut short
    # what it decided (verdict.decide): outcome, winner, leader, p_value, level, speedup, interval
    decision: Mapping[str, Any] | None = None
    added_seeds: tuple[int, ...] = ()  # confirm.runs: auto: given to the leader and the baseline

    def as_dict(self) -> dict[str, Any]:
        predicted = {"predicted": dict(self.predicted)} if self.predicted else {}
        resolved = (
            {"baseline_resolved_by": self.baseline_resolved_by} if self.baseline_resolved_by else {}
        )
        effect = {"precision_effect": dict(self.precision_effect)} if self.precision_effect else {}
        return {
            "seeds": list(self.seeds),
            "after_trials": self.after_trials,
            "configs": {label: dict(stats) for label, stats in self.configs.items()},
            **predicted,
            **resolved,
            **effect,
            **({"kept_runs": self.kept_runs} if self.kept_runs else {}),
            "decision": None if self.decision is None else dict(self.decision),
            "added_seeds": list(self.added_seeds),
        }

    def why_baseline(self) -> str:
        """Why the baseline is the answer, in one sentence; empty where a candidate won."""
        decision = self.decision or {}
        outcome, leader = decision.get("outcome"), decision.get("leader")
        if outcome == "missed":
            return (
                "No configuration the study found reached the target on most of its fresh seeds "
                "and as often as the baseline: keep the baseline."
            )
        if outcome == "not_resolved":
            return (
                f"Not resolved: {leader}'s lead over the baseline on fresh seeds "
                f"({self.lead_phrase()}) is inside the noise: keep the baseline, or raise "
                "confirm.runs (auto adds seeds until a lead is resolved)."
            )
        if outcome == "not_faster":
            return (
                "No configuration the study found beat the baseline on fresh seeds "
                "(their single-run times were luck): keep the baseline."
            )
        return ""

    def lead_phrase(self, *, ratio_said: bool = False) -> str:
        """`1.85x faster by median, 90% interval 1.40-2.30x; rank test p = 0.050 over 3 runs each,
        at most 0.050 resolves it`: the leader's speedup and how firmly the runs show it (without
        the median's ratio where the sentence has `ratio_said`)."""
        decision = self.decision or {}
        leader = decision.get("leader")
        if leader is None:
            return ""
        ratio, (low, high) = decision.get("speedup"), decision.get("interval") or (None, None)
        if ratio is None:
            speed = "the baseline's median run missed the target"
        else:
            ends = f"{low:.2f}-{high:.2f}x" if high is not None else f"{low:.2f}x or more"
            speed = (
                "" if ratio_said else f"{ratio:.2f}x faster by median, "
            ) + f"90% interval {ends}"
        runs = {self.configs.get(label, {}).get("runs", 0) for label in (leader, "baseline")}
        over = f"{runs.pop()} runs each" if len(runs) == 1 else "{} and {} runs".format(*runs)
        return (
            f"{speed}; rank test p = {decision['p_value']:.3f} over {over}, at most "
            f"{decision['level']:.3f} resolves it"
        )

    def kept_sentence(self) -> str:
        """Where some runs were measured by a run that was cut short, that they were; else empty."""
        if not self.kept_runs:
            return ""
        return (
            f"{counted(self.kept_runs, 'run')} kept from an earlier run of the confirmation that "
            "was cut short: measured then, not interleaved with the others."
        )

    def precision_sentence(self) -> str:
        """What the precision did to convergence, measured, as one sentence; empty where not
        measured."""
        effect = self.precision_effect
        if not effect:
            return ""
        return (
            f"Precision, measured: {effect['trial']} in {effect['precision']} "
            f"needed {effect['ratio']:.2f}x the samples its maths needed in fp32 "
            f"to reach the target ({effect['samples']:,.0f} against {effect['fp32_samples']:,.0f}, "
            f"median of {counted(effect['pairs'], 'seed')} where both reached it)."
        )

    def baseline_stopped_early(self) -> bool:
        """Whether the baseline ran on fewer seeds than the others, being told apart by then."""
        base = self.configs.get("baseline")
        return bool(self.baseline_resolved_by and base and base["runs"] < len(self.seeds))

    def prediction_error(self, label: str) -> float | None:
        """Measured median over predicted time, less one: how far to trust the goodput model."""
        predicted, measured = self.predicted.get(label), self.configs.get(label, {}).get("median")
        return None if not predicted or measured is None else measured / predicted - 1


@dataclasses.dataclass(frozen=True)
class StaleConfirmation:
    """A confirmation taken before faster trials came: it speaks for other trials than the best."""

    after_trials: int
    trials: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"after_trials": self.after_trials, "trials": list(self.trials)}


@dataclasses.dataclass(frozen=True)
class Summary:
    """A study's counts, its winner and the speedup over the baseline, and what exports need to
    rebuild the winning run: `limits` (max_epochs, max_seconds, eval_every), `optimizer` (the
    task's optimizer factory as module:qualname), `device` (what the trials ran on); None when
    unknown. `knobs`: the knobs an objective function's study reads (None: a training, all of them).
    """

    study: str
    target: Target
    counts: Counts
    objective: str = TIME_TO_TARGET
    best: Winner | None = None
    baseline: Baseline | None = None
    speedup: float | None = None
    confirmation: Confirmation | None = None
    limits: Mapping[str, Any] | None = None
    optimizer: str | None = None
    device: str | None = None
    probe: Mapping[str, Any] | None = None
    stale_confirmation: StaleConfirmation | None = None
    knobs: tuple[str, ...] | None = None
    # goodput: the table its trials are timed by (probe/model/goodput.py)
    throughput: Mapping[str, Any] | None = None
    devices_per_trial: int = 1  # processes (one device each) every trial trained on
    # where the study's time went, by part (report/time_spent.py); None: nothing has run
    time_spent: Mapping[str, Any] | None = None
    # of a probe or confirmation cut short: kept in the study for the next run to go on from
    measurements_kept: int = 0
    # the cores other processes kept busy while the trials trained: trials, median, min, max, cores
    trials_load: Mapping[str, Any] | None = None
    # a command study's folder of each run's output (run-SEED.log); None for any other
    logs: str | None = None

    @property
    def fixed_schedule(self) -> bool:
        return self.objective == FIXED_SCHEDULE

    def as_dict(self) -> dict[str, Any]:
        """`autotune report --json`: plain JSON values, every key present (null when unknown) but
        `stale_confirmation`, `knobs`, `throughput`, `devices_per_trial` (where not 1),
        `measurements_kept` (where not 0) and `logs`, there only when they apply."""
        out: dict[str, Any] = {
            "study": self.study,
            "target": self.target.as_record(),
            "counts": dataclasses.asdict(self.counts),
            "best": _json(self.best),
            "baseline": _json(self.baseline),
            "speedup": self.speedup,
            "confirmation": _json(self.confirmation),
            "limits": _plain_mapping(self.limits),
            "optimizer": self.optimizer,
            "device": self.device,
            "probe": _plain_mapping(self.probe),
            "objective": self.objective,
            "time_spent": _plain_mapping(self.time_spent),
        }
        if self.stale_confirmation is not None:
            out["stale_confirmation"] = self.stale_confirmation.as_dict()
        if self.knobs is not None:
            out["knobs"] = list(self.knobs)
        if self.throughput is not None:
            out["throughput"] = _plain_mapping(self.throughput)
        if self.devices_per_trial != 1:
            out["devices_per_trial"] = self.devices_per_trial
        if self.measurements_kept:
            out["measurements_kept"] = self.measurements_kept
        if self.trials_load is not None:
            out["trials_load"] = dict(self.trials_load)
        if self.logs is not None:
            out["logs"] = self.logs
        return out

    def load_sentence(self) -> str:
        """How busy the machine was while the trials trained, where other processes used a
        quarter of a core or more; and, where that moved by LOAD_MOVED cores or more, which
        figures to trust. Empty on a quiet machine."""
        load = self.trials_load
        if not load or load["max"] < BUSY_CORES:
            return ""
        sentence = (
            f"While the trials trained, other processes kept {load['min']:.1f}-{load['max']:.1f} "
            f"of {load['cores']} cores busy (median {load['median']:.1f}, over "
            f"{counted(load['trials'], 'trial')})"
        )
        if load["max"] - load["min"] >= LOAD_MOVED:
            return (
                sentence + ": the trials' times were measured under changing load, so the "
                "confirmation, interleaved on fresh seeds, is the figure to trust."
            )
        return sentence + "."


def _json(value: Any) -> Any:
    return None if value is None else value.as_dict()


def _plain_mapping(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)


def speedup_phrase(ratio: float) -> str:
    """`1.72x faster`, or `1.15x slower` when the baseline won: never `0.87x faster`."""
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def plural(noun: str, n: int | None) -> str:
    """`run` for one, `runs` for any other count."""
    return noun if n == 1 else noun + "s"


def counted(n: int, noun: str) -> str:
    """`1 run`, `3 runs`: a count and its noun, in the number the count needs."""
    return f"{n} {plural(noun, n)}"
