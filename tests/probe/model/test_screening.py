"""Screening the joint probe's compute settings: the same choice from fewer measurements."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.probe.model import roofline, screening
from autotune.spec.study_file import from_mapping

REPO = Path(__file__).resolve().parents[3]
# The 32 compute settings an H100 measured, every one, for the shapes study (batch 512).
H100 = json.loads((REPO / "benchmarks/results/roofline-shapes-small-cuda.json").read_text())
MEASURED = H100["arms"]["prior"]["probe"]["compute_rates"]


def settings_of(space_section: dict) -> list[dict]:
    raw = {"task": "shapes", "target": {"metric": "accuracy", "value": 0.9}, "space": space_section}
    return roofline.compute_settings(from_mapping(raw, path=Path("s.yaml")).space)


def h100_rate(setting: dict) -> float:
    return next(
        r["samples_per_second"] for r in MEASURED if all(r[k] == v for k, v in setting.items())
    )


def test_the_shapes_space_is_screened_to_13_settings_with_the_fastest_among_them() -> None:
    settings = settings_of({"precision": ["fp32", "fp16", "bf16"]})
    assert len(settings) == 32
    calls = []

    def measure(indices):
        calls.append(indices)
        return {i: h100_rate(settings[i]) for i in indices}

    rates = screening.screened(settings, measure)
    # 6 precision x memory format, then each toggle alone at the faster format: 3 at fp32 (TF32
    # too), 2 at each 16-bit precision; on the H100 only the fused step helped, and alone
    assert [len(c) for c in calls] == [6, 7] and len(rates) == 13
    every = max(h100_rate(s) for s in settings)
    assert max(rates.values()) >= 0.99 * every  # fp16, channels-last, the fused step
    best = settings[max(rates, key=rates.get)]
    assert (best["precision"], best["channels_last"], best["fused_optimizer"]) == (
        "fp16",
        True,
        True,
    )


def test_toggles_that_each_help_are_measured_together() -> None:
    settings = settings_of({"precision": ["fp32", "bf16"]})

    def rate(setting: dict) -> float:
        # channels-last doubles; at fp32 TF32 and the fused step each add a fifth
        speed = 100.0 * (2 if setting["channels_last"] else 1)
        if setting["precision"] == "fp32":
            speed *= (1.2 if setting["tf32"] else 1) * (1.2 if setting["fused_optimizer"] else 1)
        return speed

    rates = screening.screened(settings, lambda indices: {i: rate(settings[i]) for i in indices})
    both = [settings[i] for i in rates if settings[i]["tf32"] and settings[i]["fused_optimizer"]]
    assert both == [
        {
            "precision": "fp32",
            "channels_last": True,
            "cudnn_benchmark": False,
            "tf32": True,
            "fused_optimizer": True,
        }
    ]
    assert max(rates.values()) == max(rate(s) for s in settings)  # 100 x 2 x 1.2 x 1.2


def test_a_few_settings_are_all_measured_at_once_and_a_missing_figure_is_passed_over() -> None:
    few = settings_of({"precision": ["fp32", "bf16"], "cudnn_benchmark": False, "tf32": False})
    assert len(few) <= screening.SCREEN_ABOVE
    calls = []
    rates = screening.screened(few, lambda indices: calls.append(indices) or dict.fromkeys(indices))
    assert calls == [list(range(len(few)))] and set(rates) == set(range(len(few)))
    many = settings_of({"precision": ["fp32", "fp16", "bf16"]})
    # every setting out of memory: the first stage only, nothing to build on
    calls.clear()
    screening.screened(many, lambda indices: calls.append(indices) or dict.fromkeys(indices))
    assert [len(c) for c in calls] == [6]


def test_pinning_is_measured_only_where_the_unpinned_loader_came_close_to_the_fastest() -> None:
    loaders = roofline.loader_settings(
        [
            {"num_workers": w, "prefetch_factor": 4 if w else None, "pin_memory": p}
            for w in (0, 2, 4, 8, 16)
            for p in (False, True)
        ]
    )
    h100 = {
        (r["num_workers"], r["pin_memory"]): r["samples_per_second"]
        for r in H100["arms"]["prior"]["probe"]["loader_rates"]
    }
    calls = []

    def measure(indices):
        calls.append([(loaders[i]["num_workers"], loaders[i]["pin_memory"]) for i in indices])
        return {i: h100[loaders[i]["num_workers"], loaders[i]["pin_memory"]] for i in indices}

    rates = screening.screened_loaders(loaders, measure)
    # every worker count unpinned, fewest first; then pinned at 16 workers alone (8 delivered
    # 33,737/s against 16's 57,673)
    assert calls == [[(w, False) for w in (0, 2, 4, 8, 16)], [(16, True)]]
    assert len(rates) == 6

    # a space that leaves pinning no choice: all at once; none unpinned ran: every pinned one
    unpinned_only = [s for s in loaders if not s["pin_memory"]]
    calls.clear()
    screening.screened_loaders(unpinned_only, lambda indices: calls.append(indices) or {})
    assert calls == [list(range(5))]
    calls.clear()
    screening.screened_loaders(
        loaders, lambda indices: calls.append(indices) or dict.fromkeys(indices)
    )
    assert [len(c) for c in calls] == [5, 5]


def test_no_dataloader_is_measured_where_the_gather_on_the_device_far_outpaces_every_step() -> None:
    """A DataLoader feeds the step no faster than the step runs: beside a gather 20 times the
    fastest step's rate (gather, then step: within 5% of the step's rate), one has nothing to
    gain. The training set on the device is measured first, alone."""
    settings = roofline.loader_settings(
        [
            {
                "data_on_device": d,
                "num_workers": w,
                "prefetch_factor": 2 if w else None,
                "pin_memory": p,
            }
            for d in (False, True)
            for w in (0, 4)
            for p in (False, True)
            if not d or (w, p) == (0, False)
        ]
    )
    assert settings[0]["data_on_device"] and len(settings) == 5

    def measuring(gather: float | None) -> tuple[list[list[int]], dict[int, float | None]]:
        calls: list[list[int]] = []

        def measure(indices: list[int]) -> dict[int, float | None]:
            calls.append(indices)
            return {i: gather if settings[i]["data_on_device"] else 3_000.0 for i in indices}

        return calls, measure

    calls, measure = measuring(80_000.0)
    assert screening.screened_loaders(settings, measure, fastest_step=4_000.0) == {0: 80_000.0}
    assert calls == [[0]]
    assert screening.outpaced_by_gather([80_000.0], 4_000.0)
    # a little slower (or a faster step): a DataLoader might gain more than 5%; all measured
    for gather, step in ((79_000.0, 4_000.0), (80_000.0, 4_100.0), (None, 4_000.0)):
        calls, measure = measuring(gather)
        rates = screening.screened_loaders(settings, measure, fastest_step=step)
        assert calls[0] == [0] and set(rates) == set(range(5)), (gather, step)
        assert not screening.outpaced_by_gather([gather], step)
    # no step measured (every compute setting out of memory, say): nothing to weigh against
    calls, measure = measuring(80_000.0)
    assert len(screening.screened_loaders(settings, measure)) == 5
