"""A command trial's reports, added up into its TrialResult.

What the reports lack is filled in plainly, never guessed: epochs come from the reported `epoch`,
else from `step` of `total_steps` over the budget's max_epochs, else None (unknown), as are
optimizer steps without `step`; throughput needs `samples`; peak memory is the script's own
reported figure, else its process's peak RSS.
"""

from __future__ import annotations

import torch

from autotune.runners.protocol import Report
from autotune.train.config import Limits, TrialResult
from autotune.train.ledger import warm_up_steps
from autotune.train.measure import device_name


class Tally:
    def __init__(self, *, limits: Limits, device: torch.device) -> None:
        self.limits, self.device = limits, device
        self.reports = 0  # lines that parsed as a report, metric or not
        self.steps = 0  # the largest `step` reported
        self.total_steps = 0  # as reported; 0 while unknown
        self.last_metric: float | None = None
        self.best_metric: float | None = None
        self.reached = False
        # (seconds, epochs, metric) per metric report
        self.curve: list[tuple[float, float | None, float]] = []
        self.losses: list[float | None] = []  # beside the curve's points, as reported
        self._epoch: float | None = None
        self._stepped = False  # whether any report carried a step
        # (seconds, step, samples) per report with samples
        self._samples: list[tuple[float, int, int]] = []
        self._peak_memory: int | None = None
        self._malformed = 0  # lines on the report channel that were not a JSON object
        self._first_malformed = ""

    def malformed(self, line: str | bytes) -> None:
        """A line on the report channel that was not a report: counted, to say so if no metric
        came."""
        if not self._malformed:
            self._first_malformed = (
                line.decode(errors="replace") if isinstance(line, bytes) else line
            ).strip()[:120]
        self._malformed += 1

    def malformed_note(self) -> str:
        """'; N line(s) ... were not JSON objects ..., the first: ...', or nothing."""
        if not self._malformed:
            return ""
        return (
            f"; {self._malformed} line(s) on the report channel were not JSON objects and were "
            f"skipped, the first: {self._first_malformed!r}"
        )

    def add(self, report: Report, *, seconds: float) -> None:
        """One report, read `seconds` after the command was launched."""
        self.reports += 1
        self.steps = max(self.steps, report.step or 0)
        self._stepped = self._stepped or report.step is not None
        self.total_steps = (
            report.total_steps if report.total_steps is not None else self.total_steps
        )
        self._epoch = report.epoch if report.epoch is not None else self._epoch
        if report.samples is not None:
            self._samples.append((seconds, self.steps, report.samples))
        if report.peak_memory_bytes is not None:
            self._peak_memory = max(self._peak_memory or 0, report.peak_memory_bytes)
        if report.metric is not None:
            self.last_metric = report.metric
            self.best_metric = (
                report.metric
                if self.best_metric is None
                else self.limits.better(report.metric, self.best_metric)
            )
            epochs = report.epoch if report.epoch is not None else self._estimated_epochs()
            self.curve.append((seconds, epochs, report.metric))
            self.losses.append(report.loss)
            self.reached = self.limits.reached(report.metric)

    def epochs(self) -> float | None:
        return self._epoch if self._epoch is not None else self._estimated_epochs()

    def _estimated_epochs(self) -> float | None:
        """The schedule spans max_epochs, so step s of total T is s/T of them; None when T is
        unknown."""
        return self.steps / self.total_steps * self.limits.max_epochs if self.total_steps else None

    def samples_per_second(self) -> float | None:
        """Samples per second after warm-up (as ledger.py counts it), from reports carrying
        `samples`; evaluation between them is included. None with fewer than two such reports past
        warm-up."""
        warm_steps = warm_up_steps(self.total_steps)
        warm = [point for point in self._samples if point[1] >= warm_steps] or self._samples[1:]
        if len(warm) < 2 or warm[-1][0] <= warm[0][0] or warm[-1][2] <= warm[0][2]:
            return None
        return (warm[-1][2] - warm[0][2]) / (warm[-1][0] - warm[0][0])

    def result(self, *, stop_reason: str, elapsed: float, memory: int) -> TrialResult:
        """The trial's result, stopped for `stop_reason` after `elapsed` seconds on autotune's
        clock; `memory` is the command's peak resident memory in bytes."""
        assert self.best_metric is not None, (
            "a result needs at least one metric; the caller fails the trial"
        )
        reached = stop_reason == "target"
        return TrialResult(
            reached=reached,
            time_to_target=elapsed if reached else None,
            best_metric=self.best_metric,
            train_seconds=elapsed,
            epochs=self.epochs(),
            optimizer_steps=self.steps if self._stepped else None,
            samples_per_second=self.samples_per_second(),
            peak_memory_bytes=self._peak_memory if self._peak_memory is not None else memory,
            device_name=device_name(self.device),
            torch_version=torch.__version__,
            stop_reason=stop_reason,
            curve=tuple(self.curve),
            train_loss=tuple(self.losses) if any(v is not None for v in self.losses) else None,
        )
