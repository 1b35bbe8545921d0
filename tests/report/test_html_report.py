"""The HTML report of a small real study: every plot is in the page, every number of the winner's
section is the one `report --json` gives, and the page loads in a real browser without errors."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import pytest
import yaml

from autotune.cli import main
from autotune.record import importance
from autotune.report import html_page, plots, results, summarize

REPO = Path(__file__).resolve().parents[2]
# Where the browser test keeps its screenshot of the page, for a person to look at.
ARTIFACTS = Path(os.environ.get("AUTOTUNE_TEST_ARTIFACTS", REPO / "test-artifacts"))
# this machine's closed network refuses the rest
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Page(HTMLParser):
    """The parts of the page the tests read: figures' images, numbers tagged with data-json,
    links."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.figure: str | None = None
        self.images: dict[str, str] = {}  # figure id -> its img's src
        self.numbers: list[
            tuple[dict[str, str], str]
        ] = []  # (attributes, text) of each data-json span
        self.addresses: list[str] = []  # every src and href
        self._span: dict[str, str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.addresses += [a[k] for k in ("src", "href") if k in a]
        if tag == "figure":
            self.figure = a.get("id")
        elif tag == "img" and self.figure:
            self.images[self.figure] = a["src"]
        elif tag == "span" and "data-json" in a:
            self._span = a

    def handle_data(self, data: str) -> None:
        if self._span is not None:
            self.numbers.append((self._span, data))
            self._span = None


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study of the blobs task where micro-batches of 128 run out of memory (CUDA's
    exception, raised on CPU), with workers and two precisions, confirmed on fresh seeds."""
    folder = tmp_path_factory.mktemp("html")
    path = folder / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task": "tests.tasks:cuda_oom",
                "target": {"metric": "accuracy", "value": 0.9},
                "space": {
                    "lr": {"low": 0.02, "high": 0.3, "log": True},
                    "scheduler": ["constant", "cosine"],
                    "batch_size": [32, 128],
                    "accumulation_steps": 1,
                    "num_workers": [0, 1],
                    "precision": ["fp32", "bf16"],
                    "fused_optimizer": False,
                },
                "budget": {"trials": 10, "max_epochs": 12, "max_seconds": 60, "eval_every": 2.0},
                # the best trial beside the baseline until its lead is resolved (up to 8 seeds):
                # the baseline's time to the target varies 10x from seed to seed
                "confirm": {"top": 1, "runs": "auto"},
                "probe": "none",
                "seed": 0,
                # every trial that fits in memory trains to its end: enough for importances
                "prune": "none",
                # a slow baseline (3-8 epochs to the target, where the trials take 1), so that a
                # trial wins and the winner's section shows a speedup every time, also on a loaded
                # machine. Evaluations every 2 epochs: the first comes after warm-up (10% of 384
                # steps), so throughput is measured
                "baseline": {"lr": 0.001, "batch_size": 32, "num_workers": 0, "precision": "fp32"},
            },
            sort_keys=False,
        )
    )
    cwd = os.getcwd()
    os.chdir(REPO)  # so that tests.tasks imports
    try:
        assert main(["run", str(path)]) == 0
        assert (
            main(
                [
                    "report",
                    str(path),
                    "--html",
                    str(folder / "report.html"),
                    "--csv",
                    str(folder / "trials.csv"),
                ]
            )
            == 0
        )
    finally:
        os.chdir(cwd)
    return path


def summary_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_plot_is_in_the_page_as_an_embedded_png(study: Path) -> None:
    page = Page((study.parent / "report.html").read_text())
    assert set(page.images) == {f"plot-{name}" for name in html_page.PLOTS}
    for name, src in page.images.items():
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix), name
        image = matplotlib.image.imread(
            io.BytesIO(base64.b64decode(src[len(prefix) :])), format="png"
        )
        assert image.shape[0] >= 300 and image.shape[1] >= 500, (name, image.shape)
        assert image.std() > 0.05, f"{name} is blank"
    assert all(a.startswith(("data:", "#")) for a in page.addresses), (
        "the page must load nothing from elsewhere"
    )


def test_every_number_in_the_winners_section_is_the_one_report_json_gives(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = summary_json(study, capsys)
    page = Page((study.parent / "report.html").read_text())
    shown = {}
    for attrs, text in page.numbers:
        value = summary
        for key in attrs["data-json"].split("."):
            value = value[int(key)] if isinstance(value, list) else value[key]
        assert format(value * float(attrs.get("data-scale", 1)), attrs["data-format"]) == text, (
            attrs
        )
        shown[attrs["data-json"]] = text
    # the section in full
    assert summary["best"]["source"] == "confirmed" and summary["best"]["trial"] is not None
    for path in (
        "best.time_to_target",
        "best.min",
        "best.max",
        "best.runs",
        "baseline.time_to_target",
        "speedup",
        "best.params.lr",
        "best.params.batch_size",
        "best.telemetry.samples_per_second",
        "best.telemetry.input_wait",
        "best.telemetry.peak_memory_mb",
        *(
            f"best.per_class.classes.{k}.{f}"
            for k in range(4)
            for f in ("precision", "recall", "f1", "support")
        ),
    ):
        assert path in shown, f"{path} is not in the winner's section"


def test_the_page_has_the_side_by_side_confirmation_and_cautions_about_importances_from_few_trials(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = summary_json(study, capsys)
    text = (study.parent / "report.html").read_text()
    table = text[text.index('<table id="confirmation">') :]
    table = table[: table.index("</table>")]
    for label, stats in summary["confirmation"]["configs"].items():
        median = "not reached" if stats["median"] is None else f"{stats['median']:.2f} s"
        assert f'<td class="key">{label}</td><td>{median}</td>' in table, (label, table)
        assert f"<td>{stats['reached']}/{stats['runs']}</td>" in table
    complete = summary["counts"]["complete"]
    assert 0 < complete < html_page.IMPORTANCE_TRIALS
    assert f"From only {complete} complete trials: a rough guide" in text
    assert (
        '<div class="wide"><table' in text
        and ".wide { max-width: 100%; overflow-x: auto; }" in text
    )


def test_the_plots_show_what_the_study_did(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    trials = optuna.load_study(
        study_name="study", storage=f"sqlite:///{study.with_suffix('.db')}"
    ).get_trials()
    records = results.trial_records(trials)
    counts = results.counts(records)
    assert counts["oom"] >= 1  # the map has something to mark

    labels = {text.get_text() for text in plots.oom_map(records).axes[0].get_legend().get_texts()}
    assert "out of memory" in labels and "ran" in labels
    assert ("known to run out (not run)" in labels) == (counts["oom_bound"] > 0)

    values, why_not = importance.param_importances(
        optuna.load_study(study_name="study", storage=f"sqlite:///{study.with_suffix('.db')}")
    )
    assert values and set(values) <= {
        "lr",
        "scheduler",
        "batch_size",
        "data_on_device",
        "num_workers",
        "precision",
    }, why_not
    bars = [t.get_text() for t in plots.importances(values).axes[0].get_yticklabels()]
    assert bars == list(values)[::-1]  # the most important on top

    summary = summary_json(study, capsys)
    top = [int(n) for n in results.best_feasible(records, count=3)["number"]]
    curves = results.stored_curves(
        trials,
        top,
        confirmation=optuna.load_study(
            study_name="study", storage=f"sqlite:///{study.with_suffix('.db')}"
        ).user_attrs["confirmation"],
    )
    assert list(curves) == [*(f"trial {n}" for n in top), "baseline (confirmation run)"]
    drawn = [
        line.get_label()
        for line in plots.learning_curves(curves, target=0.9, metric="accuracy").axes[0].get_lines()
    ]
    assert drawn[: len(curves)] == list(curves)
    assert summary["counts"]["total"] == len(records)


def test_the_throughput_plot_sets_a_training_set_on_the_device_apart_from_no_workers() -> None:
    """A trial with its data on the device runs no DataLoader (num_workers 0 as stored): it has
    its own place on the axis, first; a study from before the knob has workers only."""
    import pandas as pd

    rows = [
        # (data_on_device, num_workers, precision, samples/s)
        (True, 0, "bf16", 9_000.0),
        (False, 0, "fp32", 2_000.0),
        (False, 2, "fp32", 3_000.0),
        (False, 2, "bf16", 3_500.0),
    ]
    records = pd.DataFrame(
        [
            {"data_on_device": d, "num_workers": w, "precision": p, "samples_per_second": r}
            for d, w, p, r in rows
        ]
    ).assign(input_wait=0.1)
    figure = plots.throughput_figure(records)
    speed, wait = figure.axes
    assert [t.get_text() for t in wait.get_xticklabels()] == ["on device", "0", "2"]
    at = {}  # samples/s -> its place on the axis, as drawn
    for points in speed.collections:
        for x, y in points.get_offsets():
            at[float(y)] = round(float(x))
    assert at == {9_000.0: 0, 2_000.0: 1, 3_000.0: 2, 3_500.0: 2}

    before = records.drop(columns="data_on_device").iloc[1:]
    labels = plots.throughput_figure(before).axes[1].get_xticklabels()
    assert [t.get_text() for t in labels] == ["0", "2"]


def test_csv_holds_every_trial_with_its_settings_and_measurements(study: Path) -> None:
    rows = list(csv.DictReader((study.parent / "trials.csv").open()))
    # the budget's 10 trials ran; those known to run out of memory never did, and are rows too
    assert len([r for r in rows if r["oom_bound"] != "True"]) == 10
    assert {
        "number",
        "state",
        "seconds",
        "samples_per_second",
        "input_wait",
        "peak_memory_mb",
        "lr",
        "batch_size",
        "num_workers",
        "precision",
        "reason",
    } <= set(rows[0])
    oom = [r for r in rows if r["oom"] == "True"]
    assert oom and all("out of memory" in r["reason"].lower() for r in oom)


def test_a_study_with_no_winner_yet_still_gets_a_page() -> None:
    records = results.trial_records([])
    summary = summarize.summarize(
        "empty", records, target={"metric": "accuracy", "value": 0.9}, confirmation=None
    )
    text = html_page.render(
        summary, records, curves={}, importances=None, importances_missing="no trials yet"
    )
    page = Page(text)
    assert "No trial has reached the target yet" in text and len(page.images) == len(
        html_page.PLOTS
    )


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_the_page_opens_in_a_headless_browser_without_errors(study: Path) -> None:
    executable = _chromium()
    if executable is None:
        why = "no chromium on PATH (scripts/test.sh installs Debian's chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning")
                    else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"failed to load {r.url[:80]}"))
            page.goto((study.parent / "report.html").as_uri(), wait_until="load")
            images = page.evaluate(
                "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"
            )
            # a laptop's window: nothing may be cut off
            page.set_viewport_size({"width": 1280, "height": 800})
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "html-report.png"), full_page=True)
        finally:
            browser.close()
    assert len(images) == len(html_page.PLOTS)
    assert overflow <= 0, f"the page is {overflow} px wider than a 1280-pixel window"
    unloaded = [alt for alt, complete, width in images if not complete or width == 0]
    assert not unloaded, f"images that did not load: {unloaded}"
    assert not problems, "\n".join(problems)
    assert (ARTIFACTS / "html-report.png").stat().st_size > 50_000


def test_a_page_that_cannot_be_written_is_a_clear_error(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    target = tmp_path / "no such folder" / "report.html"
    assert main(["report", str(study), "--html", str(target)]) == 2
    err = capsys.readouterr().err
    assert (
        f"--html {target}: cannot write (No such file or directory)" in err
        and "Traceback" not in err
    )


def test_importances_past_their_bound_are_over_a_seeded_sample_and_the_page_says_so(
    study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study of thousands of trials: fANOVA over a sample of them (the bound lowered here to
    below this study's complete trials), the same figures each time, announced on stderr."""
    import optuna

    stored = optuna.load_study(study_name="study", storage=f"sqlite:///{study.with_suffix('.db')}")
    complete = len(stored.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
    assert complete > 3
    monkeypatch.setattr(importance, "MAX_TRIALS", 3)
    first = importance.param_importances(stored)
    assert first[0] and first == importance.param_importances(stored)
    page = study.parent / "sampled.html"
    capsys.readouterr()
    assert main(["report", str(study), "--html", str(page)]) == 0
    err = capsys.readouterr().err
    assert f"autotune: parameter importances over 3 of {complete} complete trials ..." in err, err
    assert f"a seeded sample of 3 of the {complete} complete trials" in page.read_text()
