"""The joint probe's outcome in the report's words (probe/run.py measures and decides):
what it chose, measured beside predicted, the bottleneck, the knob space's limit and what would
move it, compile's payback and checkpointing's fit."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotune.probe.model.decide import OUTRUN
from autotune.probe.model.figures import (
    by_batch,
    checked_entry,
    first_steps_seconds,
    frontier_of,
    set_bytes,
    start_up_seconds,
)
from autotune.probe.model.roofline import INPUT, Prediction, crossing
from autotune.search.space import FORMAT_KNOBS, Choices, Space, loader_of

# What a probe stopped by its time cap before each phase does without it.
CAPPED = {
    "paired": "the baseline's setting kept",
    "compile": "torch.compile left off",
    "batches": "the chosen setting is unmeasured at the trials' other micro-batches",
}


def paired_text(paired: Mapping[str, Any]) -> str:
    """The check of the choice against the baseline's setting in paired windows (at the probe's
    micro-batch, then at the smallest a trial trains), as a line."""

    def ratios(check: Mapping[str, Any]) -> str:
        return ", ".join(f"{r:.2f}x" for r in check["ratios"])

    there = paired.get("trials_batch")
    if paired["kept"] == "chosen":
        return (
            f"Checked against the baseline's setting in {len(paired['ratios'])} paired windows: "
            f"{ratios(paired)} its speed"
            + (
                f"; at micro-batch {there['batch_size']}, the smallest a trial trains, "
                + (ratios(there) if there["ratios"] else f"not weighed: {there['why']}")
                if there
                else ""
            )
        )
    # where the trials' batch decided, its windows are the ones that tell why
    shown = there if there and there["kept"] == "baseline" else paired
    return f"The baseline's setting kept: the choice was {paired['why']}" + (
        f" (paired windows: {ratios(shown)} the baseline's speed)" if shown["ratios"] else ""
    )


def describe(outcome: Mapping[str, Any]) -> str:
    """The joint probe's lines for the report: what it chose, measured beside predicted, the
    bottleneck, the knob space's limit and what would move it."""
    loaders, computes = len(outcome["loader_rates"]), len(outcome["compute_rates"])
    head = (
        f"Joint systems probe (batch {outcome['batch_size']}: "
        f"{loaders} loader and {computes} compute settings measured apart"
        + (f" (screened from {outcome['screened_from']})" if outcome.get("screened_from") else "")
    )
    chosen, limit = outcome.get("chosen"), outcome.get("limit")
    if chosen is None:
        return (
            f"{head}, {outcome['seconds']:.1f} s): nothing settled, "
            f"as {outcome.get('unsettled', 'no setting ran')}"
        )
    head += f", {_checked(outcome['checked'])}, {outcome['seconds']:.1f} s{_phases(outcome)})"
    error = chosen["measured"] / chosen["predicted"] - 1
    lines = [
        f"{head}: {setting_text(chosen)}: {_rate(chosen['measured'])} end to end, "
        f"predicted {_rate(chosen['predicted'])} ({error:+.0%}); "
        f"{chosen['bottleneck']}-bound (loader {_rate(chosen['loader_rate'])}, "
        f"compute {_rate(chosen['compute_rate'])}, "
        f"the device waiting for input {chosen['idle_share']:.0%} of the time)",
        f"Limit of the knob space: {_rate(limit['predicted'])} predicted ({setting_text(limit)}), "
        f"{limit['bottleneck']}-bound{_sooner(outcome)}; what would move it: {outcome['moves']}",
    ]
    paired = outcome.get("paired")
    if paired:
        lines.append(paired_text(paired))
    capped = outcome.get("capped")
    if capped:
        lines.append(
            f"The probe stopped at its time cap of {capped['seconds']:.0f} s, before its "
            f"{capped['phase']} measurements: {CAPPED.get(capped['phase'], 'nothing settled')}"
        )
    outpaced = outcome.get("gather_outpaced")
    if outpaced:
        gather, step = outpaced["gather"], outpaced["step"]
        lines.append(
            f"No DataLoader measured: the training set on the device was gathered at "
            f"{_rate(gather)}, {gather / step:.0f}x the fastest step's {_rate(step)}; fed by a "
            f"DataLoader, which feeds it no faster than it runs, the step could train at most "
            f"{step / gather:.0%} faster"
        )
    ran_out = [entry for entry in outcome["loader_rates"] if entry.get("oom")]
    if ran_out:  # the training set on the device, mostly: the set itself may not fit
        lines.append(
            "Out of memory as the probe measured it, so left out: "
            + "; ".join(f"{loader_text(entry)} ({entry.get('reason')})" for entry in ran_out)
        )
    if outcome.get("run_samples"):
        lines.append(run_text(outcome))
    if outcome.get("batches"):
        lines.append(batches_text(outcome))
    compiled = outcome.get("compile")
    if compiled:
        lines.append(compile_text(compiled, batch=outcome["batch_size"]))
    if outcome.get("checkpointing"):
        lines.append(checkpointing_text(outcome["checkpointing"]))
    first = first_steps_seconds(outcome)
    if first is not None and not outcome.get("shared_cores"):
        lines.append(
            f"A process's first steps took {first:.2f} s more than later ones (loading the "
            "device's libraries and first kernels), in no setting's start-up and on no trial's "
            "clock: each process takes them before its first trial, a fresh one each trial, a "
            "warm one (isolation: warm) once"
        )
    if outcome.get("shared_cores"):
        lines.append(
            "On a CPU the loader and the step share the same cores, so what runs together "
            "differs from their rates apart: the end-to-end measurement decided"
        )
    return "\n".join(lines)


def _checked(entries: list[Mapping[str, Any]]) -> str:
    """`4 end to end (2 more outrun before their turn, 1 without a figure)`."""
    ran = sum(1 for entry in entries if entry.get("measured"))
    outrun = sum(1 for entry in entries if (entry.get("reason") or "").startswith(OUTRUN))
    failed = len(entries) - ran - outrun  # out of memory, or no window timed
    left = [f"{outrun} more outrun before their turn"] if outrun else []
    left += [f"{failed} without a figure"] if failed else []
    return f"{ran} end to end" + (f" ({', '.join(left)})" if left else "")


def run_text(outcome: Mapping[str, Any]) -> str:
    """The run the setting was chosen for, its time over that run with its start-up, and the
    fastest setting measured end to end beside it where that was another."""
    samples, (shortest, longest) = outcome["run_samples"], outcome["run_range"]

    def seconds(entry: Mapping[str, Any]) -> float:
        return entry["start_up"] + samples / entry["measured"]

    chosen = checked_entry(outcome, outcome["chosen"])
    fastest = max((e for e in outcome["checked"] if e.get("measured")), key=lambda e: e["measured"])
    line = (
        f"Chosen for a run of {samples:,.0f} samples (the middle, on a log scale, of the "
        f"shortest run a trial trains, {shortest:,.0f}, and the longest, {longest:,.0f}): "
        f"{seconds(chosen):.2f} s, {short(chosen['start_up'])} of it start-up (measured apart)"
    )
    if fastest is not chosen:
        line += (
            f"; the fastest end to end, {setting_text(fastest)} "
            f"({_rate(fastest['measured'])}), would take {seconds(fastest):.2f} s, "
            f"{short(fastest['start_up'])} of it start-up"
        )
    return line


def batches_text(outcome: Mapping[str, Any]) -> str:
    """The chosen setting at every micro-batch measured: the speed to expect (measured end to
    end; for an outcome that has none there, its rates there scaled as the end-to-end check found
    the prediction at the probe's batch) beside what its rates apart predict and which holds it,
    or why there is none."""
    at, copy = {}, set_bytes(outcome, outcome.get("chosen") or {})  # the training set's copy
    for batch, entry in by_batch(outcome).items():
        if batch == outcome["batch_size"]:
            said = f"{_rate(entry['expected'])} end to end"
        elif entry.get("measured"):
            said = (
                f"{_rate(entry['measured'])} end to end ({_rate(entry['predicted'])} "
                f"predicted, {entry['bottleneck']}-bound)"
            )
        elif entry.get("expected"):
            said = f"{_rate(entry['expected'])} {entry['bottleneck']}-bound"
        elif entry.get("oom"):
            said = "out of memory"
        else:
            said = f"no figure ({entry.get('reason')})"
        at[batch] = said + ("" if entry.get("oom") else _peak(entry.get("peak_memory_bytes"), copy))
    return (
        "The chosen setting by micro-batch (end to end where measured, else its rates there "
        "scaled as the end-to-end check found): "
        + ", ".join(f"{b}: {said}" for b, said in at.items())
    )


def _peak(peak_bytes: int | None, copy_bytes: int) -> str:
    """`, 1.2 GiB at peak` where the device's allocator peak was measured (CUDA), with the
    training set's copy (`copy_bytes`) where the setting keeps one there; else nothing."""
    return f", {(peak_bytes + copy_bytes) / 2**30:.1f} GiB at peak" if peak_bytes else ""


def what_moves_it(
    best: Prediction,
    space: Space,
    *,
    batch: int,
    cores: int,
    step_rates: Mapping[int, float] | None = None,
) -> str:
    """What would raise the limit, in numbers: the other rate's headroom, and the levers the knob
    space left out (within it, the limit has weighed every one already). `step_rates`: the chosen
    setting's step rate at each micro-batch measured, to say how much the last doubling gave."""
    if best.bottleneck == INPUT and loader_of(best.loader)["data_on_device"]:
        return (
            f"the batches made on the device: the step could run "
            f"{best.compute_rate / best.loader_rate:.2f}x faster beside a cheaper gather there"
        )
    if best.bottleneck == INPUT:
        headroom = best.compute_rate / best.loader_rate
        most, used = _largest(space["num_workers"]), best.loader["num_workers"]
        workers = (
            f"more loader workers than the space's {most}"
            + (f", with more cores than this machine's {cores}" if most >= cores else "")
            if used >= most
            else f"more cores ({used} workers delivered the most here)"
        )
        if used:
            # workers load apart, so their rate grows about as their number, cores allowing
            each = best.loader_rate / used
            workers += (
                f": at the {each:,.0f} samples/s a worker delivered, about "
                f"{math.ceil(best.compute_rate / each)} would keep up"
            )
        on_device = (
            "" if True in space["data_on_device"].values else ", or the training set on the device"
        )
        return (
            f"the input pipeline: the step could run {headroom:.2f}x faster if loading kept up "
            f"({workers}; cheaper decoding{on_device})"
        )
    headroom = best.loader_rate / best.compute_rate
    levers = []
    if set(space["precision"].values) == {"fp32"}:
        levers.append("bf16 or fp16, which the space leaves out")
    if not any(space["channels_last"].values):
        levers.append("channels-last, where the model has 2-D convolutions")
    if not any(space["compile"].values):
        levers.append("compilation")
    if batch >= _largest(space["batch_size"]):
        rates = step_rates or {}
        below = max((b for b in rates if b < batch), default=None)
        growth = (
            f": the step ran {rates[batch] / rates[below]:.2f}x as fast a sample at {batch} as "
            f"at {below}"
            if below is not None and batch in rates
            else ""
        )
        levers.append(f"a micro-batch larger than {batch}{growth}")
    return f"the compute: the loader could deliver {headroom:.2f}x more" + (
        f" ({'; '.join(levers)})" if levers else " (a faster device, or a lighter model)"
    )


def _largest(domain: Any) -> int:
    return int(max(domain.values) if isinstance(domain, Choices) else domain.high)


def _sooner(outcome: Mapping[str, Any]) -> str:
    """The setting that starts sooner than the fastest and so beats it over a shorter run, with
    the run length below which it does (the probe's `frontier`), or nothing."""
    kept = [(e, start_up_seconds(outcome, e)) for e in frontier_of(outcome)]
    if len(kept) < 2:
        return ""
    (fastest, start), (sooner, sooner_start) = kept[:2]
    samples = crossing((fastest["predicted"], start), (sooner["predicted"], sooner_start))
    others = len(kept) - 2
    return (
        f"; for a run of under {samples:,.0f} samples, faster as it starts sooner: "
        f"{setting_text(sooner)} ({_rate(sooner['predicted'])} after {short(sooner_start)} of "
        f"start-up against {short(start)})"
        + (f", and {others} more for shorter runs still" if others else "")
    )


def loader_text(setting: Mapping[str, Any]) -> str:
    """A loader setting as the report names it."""
    if loader_of(setting)["data_on_device"]:
        return "data on the device"
    shown = [f"num_workers {setting['num_workers']}"]
    if setting.get("prefetch_factor") is not None:
        shown.append(f"prefetch_factor {setting['prefetch_factor']}")
    return ", ".join([*shown, f"pin_memory {str(setting['pin_memory']).lower()}"])


def setting_text(setting: Mapping[str, Any]) -> str:
    shown = [loader_text(setting), setting["precision"]]
    # compile is never in a setting
    shown += [knob.replace("_", "-") for knob in FORMAT_KNOBS if setting.get(knob)]
    return ", ".join(shown)


def short(seconds: float) -> str:
    """A start-up as said: in milliseconds under a tenth of a second, where two would otherwise
    both read 0.00 s."""
    return f"{seconds * 1000:.0f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _phases(outcome: Mapping[str, Any]) -> str:
    """Where the probe's time went: `: compute 40 s, loaders 60 s, ...`; nothing where unstored.
    Then how many of its measurements an earlier run, cut short, had taken."""
    phases = outcome.get("phase_seconds") or {}
    kept = outcome.get("kept_measurements")
    return (
        (": " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in phases.items()))
        if phases
        else ""
    ) + (f"; {kept} measurement{'s' * (kept > 1)} kept from a run cut short" if kept else "")


def compile_text(compiled: Mapping[str, Any], *, batch: int) -> str:
    """torch.compile weighed once against the longest trial, in optimizer steps at the probe's
    batch."""
    if compiled.get("failed"):
        return f"torch.compile fixed off: {compiled['failed']}"
    if compiled.get("unmeasured") == INPUT:
        return (
            "torch.compile fixed off unmeasured: the chosen setting is input-bound, and a faster "
            "step saves nothing there"
        )
    head = (
        f"torch.compile measured once: {compiled['once_seconds']:.1f} s to compile, then "
        f"{_rate(compiled['faster'])} against {_rate(compiled['speed'])} predicted"
    )
    longest = f"a trial runs at most {compiled['longest_samples'] / batch:,.0f} steps"
    if compiled["samples"] is None:
        return f"{head}: it never pays back, so it is fixed off"
    steps = f"it pays back after {compiled['samples'] / batch:,.0f} steps of batch {batch}"
    return f"{head}: {steps}; {longest}, so it " + (
        "stays in the search" if compiled["kept"] else "is fixed off"
    )


def checkpointing_text(fit: Mapping[str, Any]) -> str:
    gib = 2**30
    memory = (
        f"the largest micro-batch ({fit['largest_batch']}) should peak at "
        f"{fit['predicted_bytes'] / gib:.1f} GiB without it"
        + (
            f" ({fit['set_bytes'] / gib:.1f} GiB of it the training set kept on the device)"
            if fit.get("set_bytes")
            else ""
        )
        + f", of the device's {fit['device_bytes'] / gib:.1f} GiB"
    )
    if fit["fits"]:
        return f"Activation checkpointing fixed off: {memory}, and it only recomputes"
    return f"Activation checkpointing stays in the search: {memory}"
