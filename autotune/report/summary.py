"""The study's summary, as a dict (for --json) and as text, made from stored results only."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from autotune.spec.study_file import FIXED_SCHEDULE, TIME_TO_TARGET
from autotune.study import confirm, objective as objective_, schema
from autotune.search import probe
from autotune.report import results, winner
from autotune.search.space import KNOBS, complete

TABLE_ROWS = 5


def summarize(
    name: str, records: pd.DataFrame, *, target: Mapping[str, Any], confirmation: Mapping[str, Any] | None,
    limits: Mapping[str, Any] | None = None, optimizer: str | None = None, device: str | None = None,
    probe_outcome: Mapping[str, Any] | None = None, objective: str = TIME_TO_TARGET,
    confusions: Mapping[int, Any] | None = None,
) -> dict[str, Any]:
    """Counts, the winner (confirmed on fresh seeds where possible) and its speedup over the baseline.

    `limits` (max_epochs, max_seconds, eval_every) and `optimizer` (the task's optimizer factory as
    module:qualname) and `device` (cpu or cuda, what the trials ran on) are what exports need to
    rebuild the winning run; None when unknown. `confusions`: trial number -> the confusion matrix
    its run ended with (classification tasks), for the winner's per-class figures. Under the fixed_schedule `objective` a
    `time_to_target` is the time of the whole schedule, whose mean final metric reaches the target.
    """
    summary: dict[str, Any] = {"study": name, "target": dict(target), "counts": results.counts(records),
                               "best": None, "baseline": None, "speedup": None, "confirmation": None,
                               "limits": dict(limits) if limits else None, "optimizer": optimizer, "device": device,
                               "probe": dict(probe_outcome) if probe_outcome else None, "objective": objective}
    best = results.best_feasible(records)
    if not best.empty:
        row = best.iloc[0]
        summary["best"] = {
            "trial": int(row["number"]), "label": f"trial {int(row['number'])}", "params": _params(row, results.param_names(records)),
            "time_to_target": float(row["seconds"]), "metric": float(row["objective_metric"]), "runs": int(row["runs"]),
            "min": None, "max": None, "source": "single run" if row["runs"] == 1 else f"mean of {int(row['runs'])} runs",
            "epochs": _plain(row["epochs"]),
        }
    covered = confirmation.get("trials") if confirmation else None
    if covered is not None and [int(n) for n in results.best_feasible(records, count=len(covered))["number"]] != covered:
        # Taken before faster trials came (the run that would redo it was stopped): it speaks for
        # other trials than the study's best, so the best is reported as unconfirmed.
        summary["stale_confirmation"] = {"after_trials": confirmation["after_trials"], "trials": covered}
        if summary["best"] is not None:
            summary["best"]["source"] += ", not confirmed"
        confirmation = None
    if confirmation:
        stats = confirm.summarize(confirmation["runs"], objective=confirmation.get("objective", TIME_TO_TARGET),
                                  target=confirmation.get("target"))
        summary["confirmation"] = {"seeds": confirmation["seeds"], "after_trials": confirmation["after_trials"],
                                   "configs": stats}
        base = stats.get(confirm.BASELINE)
        if base:
            summary["baseline"] = {"params": complete(confirmation["configs"][confirm.BASELINE]),
                                   "time_to_target": base["median"], **_spread(base)}
        label = confirm.winner(stats)
        if label is not None:
            metric = objective_.of(confirmation.get("objective", TIME_TO_TARGET)).metric
            metrics = [r[metric] for r in confirmation["runs"] if r["label"] == label and r.get(metric) is not None]
            trial = None if label == confirm.BASELINE else int(label.split()[-1])
            epochs = records.loc[records["number"] == trial, "epochs"]
            summary["best"] = {
                "trial": trial, "label": label, "params": complete(confirmation["configs"][label]),
                "time_to_target": stats[label]["median"],
                "metric": statistics.fmean(metrics) if metric == "final_metric" else statistics.median(metrics),
                **_spread(stats[label]), "source": "confirmed",
                "epochs": _plain(epochs.iloc[0]) if len(epochs) else None,  # of the study's own run of it
            }
            summary["speedup"] = confirm.speedup(stats, label)
    if summary["best"] is not None:
        _add_winner_detail(summary["best"], records, confirmation, confusions or {})
    return summary


def _add_winner_detail(best: dict[str, Any], records: pd.DataFrame, confirmation: Mapping[str, Any] | None,
                       confusions: Mapping[int, Any]) -> None:
    """The winner's hardware figures and per-class quality, from its confirmation runs where it
    was confirmed, else from its trial."""
    runs = [r for r in confirmation["runs"] if r["label"] == best["label"]] if best["source"] == "confirmed" else []
    rows = records[records["number"] == best["trial"]]
    row = {k: _plain(v) for k, v in rows.iloc[0].items()} if len(rows) else None
    best["telemetry"] = winner.telemetry(runs, row)
    best["per_class"] = winner.per_class(runs, confusions.get(best["trial"]))


def of_study(spec: Any, study: Any) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Every trial of an Optuna study as a table, and the summary made from it, the study file's
    target and limits, and what the study stored (confirmation, optimizer, definition)."""
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    knobs = results.knobs_read(attrs)
    records = results.trial_records(trials, knobs=knobs)
    target = {"metric": spec.target.metric, "value": spec.target.value}
    b = spec.budget
    limits = {"max_epochs": b.max_epochs, "max_seconds": b.max_seconds, "eval_every": b.eval_every}
    summary = summarize(spec.name, records, target=target, confirmation=schema.confirmation(attrs), limits=limits,
                        optimizer=schema.optimizer(attrs), device=schema.device(attrs),
                        probe_outcome=schema.probe(attrs), objective=spec.objective,
                        confusions={t.number: schema.measured(t).get("confusion") for t in trials})
    if schema.knobs_read(attrs) is not None:
        _show_only(summary, knobs)
    return records, summary


def _show_only(summary: dict[str, Any], knobs: Sequence[str]) -> None:
    """A study whose function reads only some knobs: its configurations show only those (and
    the parameters), and `knobs` tells exports not to invent the rest."""
    summary["knobs"] = list(knobs)
    for who in (summary["best"], summary["baseline"]):
        if who is not None:
            who["params"] = {k: v for k, v in who["params"].items() if k in knobs or k not in KNOBS}


def _params(row: pd.Series, extra: list[str]) -> dict[str, Any]:
    return complete({k: _plain(row.get(k)) for k in (*KNOBS, *extra)})


def _plain(value: Any) -> Any:
    """numpy scalars and NaN to plain Python values for JSON."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _spread(stats: Mapping[str, Any]) -> dict[str, Any]:
    return {"runs": stats["runs"], "reached": stats["reached"], "min": stats["min"], "max": stats["max"]}


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f} s"


def render(summary: Mapping[str, Any], records: pd.DataFrame) -> str:
    """The text report: counts, the best single runs, the confirmation and the winner."""
    c, target = summary["counts"], summary["target"]
    diverged = f", {c['diverged']} diverged" if c["diverged"] else ""
    lines = [
        f"Study {summary['study']}: {c['total']} trials: {c['complete']} complete ({c['feasible']} reached the target), "
        f"{c['pruned']} pruned ({c['past_incumbent']} could no longer win, {c['oom']} out of memory, "
        f"{c['oom_bound']} known to run out{diverged}), {c['failed']} failed, {c['interrupted']} interrupted",
        f"Target: {target['metric']} >= {target['value']}",
    ]
    if summary.get("probe"):
        lines.append(probe.describe(summary["probe"]))
    top = results.best_feasible(records, count=TABLE_ROWS)
    if top.empty:
        lines.append("No trial reached the target yet.")
        return "\n".join(lines)
    fixed = summary.get("objective") == FIXED_SCHEDULE
    columns = ["number", "seconds", "objective_metric", "epochs", "samples_per_second", *results.knob_names(records), *results.param_names(records)]
    table = top[columns].rename(
        columns={"number": "trial", "objective_metric": f"{objective_.of(summary.get('objective') or TIME_TO_TARGET).metric_label}{target['metric']}",
                 "samples_per_second": "samples/s", "accumulation_steps": "accum", "prefetch_factor": "prefetch",
                 "schedule_epochs": "schedule", "channels_last": "channels_last", "cudnn_benchmark": "cudnn"})
    for column in table.columns:
        if table[column].dtype == object:  # knobs and parameters, kept as stored: na_rep skips None there
            table[column] = table[column].map(_cell)
    runs = {int(n) for n in top["runs"].dropna()} or {1}
    each = ("one run each" if runs == {1} else f"mean of {max(runs)} runs each" if len(runs) == 1
            else f"mean of {min(runs)}-{max(runs)} runs each")
    lines += ["", f"Fastest trials ({'whole schedules, ' if fixed else ''}{each}):",
              table.to_string(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-")]
    stale = summary.get("stale_confirmation")
    if stale:
        lines += ["", f"Not confirmed: the confirmation on fresh seeds was taken after {stale['after_trials']} trials, of "
                      f"trials {', '.join(str(n) for n in stale['trials'])}, and the study's fastest trials have changed since. "
                      f"`autotune run` with the same study file redoes it."]
    confirmation = summary["confirmation"]
    if confirmation:
        judged = " (median time of the whole schedule, mean final metric)" if fixed else \
            " (median, range of runs that reached the target)"
        lines += ["", f"Re-measured side by side on {len(confirmation['seeds'])} fresh seeds{judged}:"]
        for label, stats in confirmation["configs"].items():
            spread = f"{stats['min']:.2f}-{stats['max']:.2f} s" if stats["min"] is not None else "-"
            if fixed:
                final = stats.get("mean_final_metric")
                lines.append(f"  {label:<10} {_seconds(stats['median']):>12}  range {spread}, mean final {target['metric']} "
                             f"{'-' if final is None else f'{final:.4f}'}")
            else:
                lines.append(f"  {label:<10} {_seconds(stats['median']):>12}  range {spread}, reached in {stats['reached']}/{stats['runs']} runs")
    best = summary["best"]
    lines += ["", f"Winner: {'the baseline' if best['trial'] is None else best['label']} ({best['source']})"]
    lines += [f"  {k}: {_plain(v)}" for k, v in best["params"].items()]
    base = summary["baseline"]
    goal = f"{target['metric']} >= {target['value']}"
    # fixed_schedule: a time is that of the whole schedule, which reaches the goal on average
    reaches = (lambda who: f"trains its whole {_epochs(who)} schedule to a mean {goal}") if fixed else (lambda who: f"reaches {goal}")
    if best["trial"] is None and base:
        lines.append(f"No configuration the study found beat the baseline on fresh seeds (their single-run times were "
                     f"luck): keep the baseline, which {reaches(best)} in "
                     f"{best['time_to_target']:.2f} s (median of {best['runs']} runs, range {best['min']:.2f}-{best['max']:.2f} s).")
    elif best["source"] == "confirmed" and base:
        how = f"median of {best['runs']} runs, range {best['min']:.2f}-{best['max']:.2f} s"
        if summary["speedup"]:
            baseline_is = f"the baseline's {_epochs(base)} schedule" if fixed else "the baseline"
            base_how = f"median of {base['runs']} runs, range {base['min']:.2f}-{base['max']:.2f} s"
            lines.append(f"{_capital(reaches(best))} in {best['time_to_target']:.2f} s ({how}); "
                         f"{baseline_is} takes {base['time_to_target']:.2f} s ({base_how}): "
                         f"{speedup_phrase(summary['speedup'])}.")
        elif fixed:
            lines.append(f"{_capital(reaches(best))} in {best['time_to_target']:.2f} s ({how}); the baseline's "
                         f"{_epochs(base)} schedule does not reach a mean {goal}.")
        else:
            lines.append(f"{_capital(reaches(best))} in {best['time_to_target']:.2f} s ({how}); "
                         f"the baseline reached it in only {base['reached']} of {base['runs']} runs.")
    else:
        lines.append(f"{_capital(reaches(best))} in {best['time_to_target']:.2f} s ({best['source']}, not confirmed on fresh seeds).")
    lines += winner.describe(best)
    return "\n".join(lines)


def _capital(phrase: str) -> str:
    """The phrase as a sentence's start (str.capitalize would lower the rest, the metric's name too)."""
    return phrase[:1].upper() + phrase[1:]


def _epochs(who: Mapping[str, Any]) -> str:
    """`2.5-epoch`: the length of a configuration's schedule, as a phrase."""
    epochs = who["params"].get("schedule_epochs")
    return f"{'?' if epochs is None else f'{epochs:.3g}'}-epoch"


def _cell(value: Any) -> str:
    """A knob's or parameter's value in the table: as stored, `-` where it does not exist."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def speedup_phrase(ratio: float) -> str:
    """`1.72x faster`, or `1.15x slower` when the baseline won: never `0.87x faster`."""
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
