"""`autotune report`: a study's Summary as text: counts, the fastest trials, the confirmation,
the winner."""

from __future__ import annotations

from typing import Any

import pandas as pd

from autotune.probe.model import goodput, outcome
from autotune.record import objectives
from autotune.record.summary import Baseline, Summary, Winner, counted, speedup_phrase
from autotune.report import results, time_spent, winner

TABLE_ROWS = 5
SHORT_NAMES = {
    "number": "trial",
    "samples_per_second": "samples/s",
    "accumulation_steps": "accum",
    "data_on_device": "on_device",
    "prefetch_factor": "prefetch",
    "schedule_epochs": "schedule",
    "cudnn_benchmark": "cudnn",
    "fused_optimizer": "fused",
    "checkpointing": "ckpt",
    "ddp_bucket_cap_mb": "bucket_mb",
    "ddp_gradient_as_bucket_view": "bucket_view",
    "ddp_static_graph": "static",
}


def cut_short(kept: int) -> str:
    """The line for a probe or confirmation that a run did not finish."""
    return (
        f"Measurements cut short: {counted(kept, 'measurement')} kept in the study; "
        "`autotune run` with the same study file goes on from them."
    )


def render(summary: Summary, records: pd.DataFrame) -> str:
    """The text report of `summary`, with the fastest of `records` (results.trial_records) as a
    table."""
    lines = [_counts(summary), f"Target: {summary.target.text}"]
    if summary.devices_per_trial != 1:
        lines.append(
            f"Each trial trained on {summary.devices_per_trial} devices "
            "(DistributedDataParallel; batch_size is per device)"
        )
    if summary.probe:
        lines.append(outcome.describe(summary.probe))
    if summary.throughput:
        lines.append(goodput.describe(summary.throughput))
    if summary.measurements_kept:
        lines.append(cut_short(summary.measurements_kept))
    if summary.time_spent:
        lines.append(time_spent.describe(summary.time_spent))
    if summary.load_sentence():
        lines.append(summary.load_sentence())
    if summary.logs is not None:
        lines.append(f"Each run's output: {summary.logs}/run-SEED.log")
    top = results.best_feasible(records, count=TABLE_ROWS)
    if top.empty or summary.best is None:
        lines.append("No trial reached the target yet.")
        return "\n".join(lines)
    lines += ["", *_fastest(summary, top)]
    stale = summary.stale_confirmation
    if stale:
        lines += [
            "",
            f"Not confirmed: the confirmation on fresh seeds was taken after {stale.after_trials} "
            f"trials, of trials {', '.join(str(n) for n in stale.trials)}, "
            "and the study's fastest trials have changed since. "
            f"`autotune run` with the same study file redoes it.",
        ]
    if summary.confirmation:
        lines += ["", *_confirmation(summary)]
    best = summary.best
    lines += ["", f"Winner: {_winner_name(best, records)} ({best.source})"]
    # as the table shows a knob that does not apply
    lines += [f"  {k}: {'-' if v is None else v}" for k, v in best.params.items()]
    lines.append(_verdict(summary, best, summary.baseline))
    for line in (winner.prediction_line, winner.limit_line):
        said = line(winner.timing(summary), best)
        lines += [said] if said else []
    lines += winner.figure_lines(best.telemetry, best.per_class)
    return "\n".join(lines)


def _winner_name(best: Winner, records: pd.DataFrame) -> str:
    if best.is_baseline:
        return "the baseline"
    queued = records.loc[records["number"] == best.trial, "baseline"]
    return best.label + (", the baseline's configuration, queued first" if queued.any() else "")


def _counts(summary: Summary) -> str:
    c = summary.counts
    too_large = f", {c.too_large} larger than the training set" if c.too_large else ""
    diverged = f", {c.diverged} diverged" if c.diverged else ""
    return (
        f"Study {summary.study}: {counted(c.total, 'trial')}: "
        f"{c.complete} complete ({c.feasible} reached the target), "
        f"{c.pruned} pruned ({c.past_incumbent} could no longer win, {c.oom} out of memory, "
        f"{c.oom_bound} known to run out{too_large}{diverged}), {c.failed} failed, "
        f"{c.interrupted} interrupted"
    )


def _fastest(summary: Summary, top: pd.DataFrame) -> list[str]:
    """The fastest feasible trials as a table, with how many runs each time is the mean of."""
    metric_label = objectives.of(summary.objective).metric_label + summary.target.metric
    # a figure no trial reported (an iteration-based script has no epochs) is left out
    reported = [c for c in ("epochs", "samples_per_second") if top[c].notna().any()]
    columns = [
        "number",
        "seconds",
        "objective_metric",
        *reported,
        *results.knob_names(top),
        *results.param_names(top),
        *(["devices"] if top["devices"].notna().any() else []),  # under --workers on GPUs
    ]
    table = top[columns].rename(columns={**SHORT_NAMES, "objective_metric": metric_label})
    predicted = winner.predicted_column(winner.timing(summary), top.to_dict("records"))
    if predicted is not None:  # the joint probe's figures, for its samples at its setting
        table.insert(2, "predicted", predicted)
    if top["baseline"].eq(True).any():  # first_trial: baseline
        table["trial"] = [
            f"{n} (baseline)" if queued is True else str(n)
            for n, queued in zip(top["number"], top["baseline"])
        ]
    for column in table.columns:
        # knobs and parameters, kept as stored: na_rep skips None there
        if table[column].dtype == object:
            table[column] = table[column].map(_cell)
    runs = {int(n) for n in top["runs"].dropna()} or {1}
    each = (
        "one run each"
        if runs == {1}
        else f"mean of {max(runs)} runs each"
        if len(runs) == 1
        else f"mean of {min(runs)}-{max(runs)} runs each"
    )
    return [
        f"Fastest trials ({'whole schedules, ' if summary.fixed_schedule else ''}{each}):",
        table.to_string(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-"),
    ]


def _confirmation(summary: Summary) -> list[str]:
    """One line per configuration re-measured on fresh seeds."""
    confirmation, metric = summary.confirmation, summary.target.metric
    judged = (
        " (median time of the whole schedule, mean final metric)"
        if summary.fixed_schedule
        else " (median, range of runs that reached the target)"
    )
    added = confirmation.added_seeds
    more = (
        f" and {len(added)} more for {(confirmation.decision or {}).get('leader')} and the "
        "baseline (confirm.runs: auto)"
        if added
        else ""
    )
    lines = [
        f"Re-measured side by side on {counted(len(confirmation.seeds), 'fresh seed')}{more}"
        f"{judged}:"
    ]
    for label, stats in confirmation.configs.items():
        spread = f"{stats['min']:.2f}-{stats['max']:.2f} s" if stats["min"] is not None else "-"
        head = f"  {label:<10} {_seconds(stats['median']):>12}  range {spread}, "
        if summary.fixed_schedule:
            final = stats.get("mean_final_metric")
            lines.append(head + f"mean final {metric} {'-' if final is None else f'{final:.4f}'}")
        else:
            lines.append(
                head
                + f"reached in {stats['reached']}/{stats['runs']} runs"
                + _predicted(confirmation, label)
            )
    if confirmation.precision_sentence():
        lines.append("  " + confirmation.precision_sentence())
    if confirmation.kept_sentence():
        lines.append("  " + confirmation.kept_sentence())
    if confirmation.baseline_stopped_early():
        runs = confirmation.configs["baseline"]["runs"]
        lines.append(
            f"  The baseline ran on {runs} of the {len(confirmation.seeds)} seeds: "
            f"by then {'its run' if runs == 1 else 'each of its runs'} took at least "
            f"{confirmation.baseline_resolved_by:g}x the slowest run of every other "
            "configuration, so more could not change which is faster "
            "(confirm.baseline: until_resolved)"
        )
    return lines


def _predicted(confirmation: Any, label: str) -> str:
    """ ", predicted 1.20 s (measured +5%)": the goodput search's prediction beside the
    measurement."""
    predicted = confirmation.predicted.get(label)
    if predicted is None:
        return ""
    error = confirmation.prediction_error(label)
    return f"; predicted {predicted:.2f} s" + ("" if error is None else f" (measured {error:+.0%})")


def _verdict(summary: Summary, best: Winner, base: Baseline | None) -> str:
    """What to do, in one sentence: keep the baseline, or use the winner and how much faster it
    is."""
    goal = summary.target.text
    fixed = summary.fixed_schedule

    # fixed_schedule: a time is that of the whole schedule, which reaches the goal on average
    def reaches(params: Any) -> str:
        return (
            f"trains its whole {_epochs(params)} schedule to a mean {goal}"
            if fixed
            else f"reaches {goal}"
        )

    if best.is_baseline and base:
        why = summary.confirmation.why_baseline() if summary.confirmation else ""
        if base.time_to_target is None:
            return (
                f"{why} The baseline reached {goal} in only {base.reached} of "
                f"{counted(base.runs, 'run')}"
                f"{base.why_missed(summary.limits)}."
            )
        return (
            f"{why} The baseline {reaches(best.params)} in {best.time_to_target:.2f} s "
            f"(median of {counted(best.runs, 'run')}, range {best.min:.2f}-{best.max:.2f} s)."
        )
    if not (best.confirmed and base):
        return (
            f"{_capital(reaches(best.params))} in {best.time_to_target:.2f} s "
            f"({best.source}, not confirmed on fresh seeds)."
        )
    claim = (
        f"{_capital(reaches(best.params))} in {best.time_to_target:.2f} s "
        f"(median of {counted(best.runs, 'run')}, range {best.min:.2f}-{best.max:.2f} s); "
    )
    if summary.speedup:
        baseline_is = f"the baseline's {_epochs(base.params)} schedule" if fixed else "the baseline"
        return (
            claim + f"{baseline_is} takes {base.time_to_target:.2f} s "
            f"(median of {counted(base.runs, 'run')}, range "
            f"{base.min:.2f}-{base.max:.2f} s): {speedup_phrase(summary.speedup)}"
            f" ({summary.confirmation.lead_phrase(ratio_said=True)})."
        )
    if fixed:
        return (
            claim + f"the baseline's {_epochs(base.params)} schedule does not reach a mean {goal}."
        )
    return (
        claim + f"the baseline reached it in only {base.reached} of {counted(base.runs, 'run')}"
        f"{base.why_missed(summary.limits)}."
    )


def _capital(phrase: str) -> str:
    """The phrase as a sentence's start (str.capitalize would lower the rest, the metric's name
    too)."""
    return phrase[:1].upper() + phrase[1:]


def _epochs(params: Any) -> str:
    """`2.5-epoch`: the length of a configuration's schedule, as a phrase."""
    epochs = params.get("schedule_epochs")
    return f"{'?' if epochs is None else f'{epochs:.3g}'}-epoch"


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f} s"


def _cell(value: Any) -> str:
    """A knob's or parameter's value in the table: as stored, `-` where it does not exist."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
