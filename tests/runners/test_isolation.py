"""Trials in child processes: hangs are killed, crashes recorded, OOM still an OOM, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.runners import isolation, reasons
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from tests.tasks import OOM_BATCH, blobs

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits(target=0.9, max_epochs=2, max_seconds=5, eval_every=0.5)
CPU = torch.device("cpu")


def config(batch_size: int) -> TrialConfig:
    return TrialConfig.from_mapping(
        complete({**DEFAULT_BASELINE, "batch_size": batch_size, "lr": 0.1})
    )


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports in the child


@pytest.mark.parametrize(
    ("task", "reason", "oom", "hang_after"),
    [
        # the hang waits out its limit: a short one
        ("hangs", "timeout: no result after 1 s", False, 1),
        # the others must fail by themselves long before theirs, on a busy machine too
        ("exits", "crashed: the trial's process exited with status 3", False, 30),
        ("segfaults", "crashed: the trial's process was killed by SIGSEGV", False, 30),
        ("allocator_oom", "out of memory: RuntimeError", True, 30),
    ],
)
def test_a_child_that_misbehaves_becomes_a_reasoned_failure(
    task: str, reason: str, oom: bool, hang_after: float
) -> None:
    run_trial = isolation.in_child(
        f"tests.tasks:{task}", study_path=REPO / "study.yaml", hang_after=hang_after
    )
    started = time.monotonic()
    with pytest.raises(isolation.TrialFailure) as failure:
        run_trial(config(OOM_BATCH), limits=LIMITS, device=CPU, seed=1)
    assert failure.value.reason.startswith(reason), failure.value.reason
    assert failure.value.oom == oom
    # the hang (of an hour) was killed at its limit, not waited out; the bound is loose, as the
    # first child waits for the fork server to import torch, on a busy machine for long
    assert time.monotonic() - started < 120


def test_a_child_trains_the_same_trial_as_this_process() -> None:
    steps: list[int] = []
    in_child = isolation.in_child(
        "tests.tasks:blobs", study_path=REPO / "study.yaml", hang_after=60
    )
    there = in_child(
        config(32),
        limits=LIMITS,
        device=CPU,
        seed=7,
        progress=lambda s, t, m, seconds, paused: steps.append(s),
    )
    here = isolation.in_process(blobs())(config(32), limits=LIMITS, device=CPU, seed=7)
    # same metric at the same epochs
    assert [point[1:] for point in there.curve] == [point[1:] for point in here.curve]
    assert there.best_metric == here.best_metric and there.optimizer_steps == here.optimizer_steps
    assert there.train_loss == pytest.approx(here.train_loss)  # the loss comes back too
    assert steps and steps[-1] <= there.optimizer_steps  # progress came back from the child


def write_study(
    folder: Path, task: str, *, batch_sizes: tuple[int, ...] = (16, OOM_BATCH), **budget: float
) -> Path:
    study = {
        "task": task,
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {"batch_size": list(batch_sizes), "num_workers": 0, "precision": "fp32"},
        "budget": {"trials": 4, "max_epochs": 2, "max_seconds": 5, "eval_every": 0.5, **budget},
        "confirm": {"top": 1, "runs": 1},
        "isolation": "process",
        # No test here is about the systems probe, which would spend seconds measuring first (and
        # on a busy machine, its measurements' limit of four trial timeouts).
        "probe": "none",
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


# (task, reason, mode, trial_timeout). A crash needs no timeout: a long one. A hang waits its
# timeout out, each time: a short one, yet longer than a trial that trains takes (up to its
# max_seconds of 5, and on a busy machine more): with 3 s, trials of batch 16 timed out at load 6.
CRASHED_AND_HUNG = [
    ("segfaults", "crashed: ", "process", 60),
    ("hangs", "timeout: ", "process", 10),
    ("segfaults", "crashed: ", "warm", 60),
]


@pytest.fixture(scope="module")
def crashed_and_hung_studies(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple, tuple[Path, subprocess.Popen]]]:
    """The studies of test_a_study_goes_on_past_crashed_and_hung_trials, started at once: each
    spends much of its time waiting (on its fork server's start, on a hung trial's timeout), and
    none has a figure of time that the others' load could reach."""
    studies = {}
    for case in CRASHED_AND_HUNG:
        task, _, mode, trial_timeout = case
        folder = tmp_path_factory.mktemp(f"{task}-{mode}")
        path = write_study(folder, f"tests.tasks:{task}", trial_timeout=trial_timeout)
        # sampled first trials (the prior would put all at 16): seed 0 draws OOM_BATCH for trial 1
        path.write_text(
            path.read_text().replace("isolation: process", f"isolation: {mode}")
            + "first_trial: sampled\nseed: 0\n"
        )
        # to files: a pipe that nobody reads while the other tests go on could fill and stop it
        with open(folder / "out", "w") as out, open(folder / "err", "w") as err:
            run = subprocess.Popen(
                [sys.executable, "-m", "autotune", "run", str(path)],
                cwd=REPO,
                stdout=out,
                stderr=err,
            )
        studies[case] = (folder, run)
    yield studies
    for _, run in studies.values():  # those a failed test left running
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.parametrize(("task", "reason", "mode", "trial_timeout"), CRASHED_AND_HUNG)
def test_a_study_goes_on_past_crashed_and_hung_trials(
    crashed_and_hung_studies: dict[tuple, tuple[Path, subprocess.Popen]],
    task: str,
    reason: str,
    mode: str,
    trial_timeout: float,
) -> None:
    """In a fresh child per trial, or in a warm one that the crash makes the study replace."""
    folder, run = crashed_and_hung_studies[(task, reason, mode, trial_timeout)]
    returncode = run.wait(timeout=300)
    stdout, stderr = (folder / "out").read_text(), (folder / "err").read_text()
    assert returncode == 0, stderr
    trials = optuna.load_study(
        study_name="study", storage=f"sqlite:///{folder / 'study.db'}"
    ).get_trials()
    assert len(trials) == 4
    # the misbehaving batch was drawn, so its crash or hang is what is checked below
    assert any(t.params["batch_size"] == OOM_BATCH for t in trials), [t.params for t in trials]
    for trial in trials:
        if trial.params["batch_size"] == OOM_BATCH:
            assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs[
                "reason"
            ].startswith(reason)
        else:  # trained, or stopped once it could no longer beat the best (prune: incumbent)
            assert trial.state == optuna.trial.TrialState.COMPLETE or (
                trial.state == optuna.trial.TrialState.PRUNED
                and trial.user_attrs["reason"].startswith("pruned: ")
            )
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert "Winner: " in stdout


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def still_alive(pids: list[int], *, within: float = 20.0) -> list[int]:
    """Those of `pids` alive `within` seconds from now, or none once all are gone. A process
    killed, or left to notice its parent's exit, goes a moment later on a busy machine."""
    deadline = time.monotonic() + within
    while [p for p in pids if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_killing_the_study_leaves_no_trial_process_behind(tmp_path: Path) -> None:
    # every trial hangs, for minutes
    path = write_study(tmp_path, "tests.tasks:hangs", batch_sizes=(OOM_BATCH,))
    study = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline, descendants = time.monotonic() + 120, []
    while (
        time.monotonic() < deadline and not descendants
    ):  # the fork server, and under it the trial
        descendants = [
            grandchild for child in children(study.pid) for grandchild in children(child)
        ]
        time.sleep(0.2)
    assert descendants, "no trial process appeared"
    time.sleep(1.0)
    assert all(alive(p) for p in descendants), "the trial was meant to hang"
    os.kill(study.pid, signal.SIGKILL)
    study.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(p) for p in descendants):
        time.sleep(0.2)
    assert not any(alive(p) for p in descendants), "a trial process outlived the study"


def test_what_torch_imports_lazily_is_imported_before_the_first_trial_clock() -> None:
    """The first optimizer built imports torch._dynamo (about 2 s): that must not be trial time."""
    code = (
        "import sys; from autotune.runners import isolation; from tests.tasks import blobs; "
        "assert 'torch._dynamo' not in sys.modules; isolation.in_process(blobs()); "
        "assert all(name in sys.modules for name in isolation.LAZY_IMPORTS)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("where", ["in process", "in a child"])
def test_a_loader_workers_error_keeps_its_message_and_the_users_line(where: str) -> None:
    """torch re-raises a worker's error as 'Caught IndexError in DataLoader worker process 0': the
    reason gives the worker's own last line and the line of the user's dataset that raised it."""
    from tests import tasks

    run_trial = (
        isolation.in_process(tasks.bad_sample())
        if where == "in process"
        else isolation.in_child(
            "tests.tasks:bad_sample", study_path=REPO / "study.yaml", hang_after=60
        )
    )
    loading = TrialConfig.from_mapping(
        complete({**DEFAULT_BASELINE, "num_workers": 1, "prefetch_factor": 2})
    )
    with pytest.raises(isolation.TrialFailure) as failure:
        run_trial(loading, limits=LIMITS, device=CPU, seed=1)
    line = next(
        n
        for n, text in enumerate(Path(tasks.__file__).read_text().splitlines(), 1)
        if "is unreadable" in text
    )
    assert failure.value.reason == (
        f"IndexError: sample 100 is unreadable (in DataLoader worker process 0, "
        f"at {Path(tasks.__file__).resolve()}:{line})"
    )


def test_a_trial_whose_loader_worker_raised_leaves_no_worker_and_its_process_exits() -> None:
    """The error's traceback keeps the trial's loader alive; its other workers must still be shut
    down, or the process that ran the trial waits for them at exit (they put SIGTERM off)."""
    code = (
        "import multiprocessing, torch\n"
        "from autotune.runners import isolation\n"
        "from autotune.search.space import DEFAULT_BASELINE, complete\n"
        "from autotune.train.trial import Limits, TrialConfig\n"
        "from tests import tasks\n"
        "config = TrialConfig.from_mapping(complete({**DEFAULT_BASELINE, 'num_workers': 2, "
        "'prefetch_factor': 2}))\n"
        "limits = Limits(target=0.9, max_epochs=2, max_seconds=5, eval_every=0.5)\n"
        "try:\n"
        "    isolation.in_process(tasks.bad_sample())(config, limits=limits, "
        "device=torch.device('cpu'), seed=1)\n"
        "except isolation.TrialFailure as exc:\n"
        "    kept = exc  # as a caller that reports it later does\n"
        "print(len(multiprocessing.active_children()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0 and result.stdout.split() == ["0"], result.stderr


def test_a_loader_worker_given_sigterm_leaves_on_its_own_when_nobody_shuts_it_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What multiprocessing does to leftover workers at interpreter exit: SIGTERM, then wait. The
    worker waits a grace period for its trial to shut it down in order, then exits with status 0
    (which torch does not report as a failed worker)."""
    from torch.utils.data import DataLoader

    from autotune import signals
    from autotune.train.loader import _worker_init, endless

    monkeypatch.setattr(signals, "WORKER_GRACE_SECONDS", 2)  # read in the forked worker
    loader = DataLoader(
        blobs().train,
        batch_size=64,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=_worker_init,
    )
    batches = endless(loader)  # as a trial starts them: forked with the signals held back
    next(batches)
    workers = list(loader._iterator._workers)
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert all(worker.is_alive() for worker in workers)  # its trial may still shut it down in order
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    batches.close()


def test_an_error_is_placed_in_the_users_code_not_in_torch() -> None:
    def users_code() -> None:
        torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 7]))  # 7 of 3

    try:
        users_code()
    except Exception as exc:  # noqa: BLE001 - any error torch raises here
        reason = reasons.error_reason(exc)
    line = users_code.__code__.co_firstlineno + 1
    assert (
        reason.endswith(f"(at {Path(__file__).resolve()}:{line})")
        and "Target 7 is out of bounds" in reason
    )


def test_no_process_outlives_a_study_whose_trials_with_loader_workers_hit_their_timeout(
    tmp_path: Path,
) -> None:
    """Every process the study started, the fork server, trial processes and their DataLoader
    workers included, is gone once `autotune run` has exited."""
    path = write_study(
        tmp_path,
        "tests.tasks:hangs_with_workers",
        batch_sizes=(OOM_BATCH,),
        trial_timeout=3,
        trials=1,  # one trial process, its loader workers, the fork server: all there is to leave
    )
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(num_workers=2, prefetch_factor=2)
    raw["confirm"] = {"top": 0}
    path.write_text(yaml.safe_dump(raw))
    study = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: set[int] = set()
    while study.poll() is None:  # every descendant, as they come and go
        frontier = [study.pid]
        while frontier:
            found = [c for parent in frontier for c in children(parent)]
            seen.update(found)
            frontier = found
        time.sleep(0.1)
    assert study.returncode == 1  # every trial failed (timed out)
    assert len(seen) >= 4, seen  # the fork server, a trial process, its two loader workers
    assert not still_alive(sorted(seen)), "processes outlived the study"


def test_a_trial_killed_at_its_timeout_takes_its_loader_workers_with_it() -> None:
    """The child and its DataLoader workers are one process group, killed together: no worker is
    left behind with nobody to wait on it."""
    import tempfile

    from tests.tasks import WORKER_PIDS

    for old in Path(tempfile.gettempdir()).glob(WORKER_PIDS):
        old.unlink()
    run_trial = isolation.in_child(
        "tests.tasks:hangs_with_workers", study_path=REPO / "study.yaml", hang_after=5
    )
    loading = TrialConfig.from_mapping(
        complete(
            {**DEFAULT_BASELINE, "batch_size": OOM_BATCH, "num_workers": 2, "prefetch_factor": 2}
        )
    )
    with pytest.raises(isolation.TrialFailure, match="^timeout: "):
        run_trial(loading, limits=LIMITS, device=CPU, seed=1)
    workers = [int(p.name.rsplit("-", 1)[1]) for p in Path(tempfile.gettempdir()).glob(WORKER_PIDS)]
    assert len(workers) == 2  # both loaded while the model hung
    time.sleep(0.5)
    assert not [pid for pid in workers if alive(pid)], "loader workers outlived their trial"


def test_a_trials_loader_workers_are_forked_from_the_trial_as_in_the_users_own_training() -> None:
    """Not started through a fork server of the trial's own, as a fork server's child does by
    default: each worker would then import torch and unpickle the whole dataset, seconds a trial
    that the user's training does not pay (seen on an H100 with the shapes task)."""
    import tempfile

    from tests.tasks import WORKER_PIDS

    for old in Path(tempfile.gettempdir()).glob(WORKER_PIDS):
        old.unlink()
    run_trial = isolation.in_child(
        "tests.tasks:notes_workers", study_path=REPO / "study.yaml", hang_after=60
    )
    loading = TrialConfig.from_mapping(
        complete({**DEFAULT_BASELINE, "num_workers": 2, "prefetch_factor": 2, "lr": 0.1})
    )
    run_trial(loading, limits=LIMITS, device=CPU, seed=1)
    notes = [p.read_text().split() for p in Path(tempfile.gettempdir()).glob(WORKER_PIDS)]
    assert len(notes) == 2  # both workers loaded
    # forked by the process that started them
    assert all(len(note) == 2 and note[0] == note[1] for note in notes), notes


@pytest.mark.parametrize(
    ("isolation_mode", "told"), [("auto", True), ("none", True), ("warm", False)]
)
def test_a_trial_timeout_that_cannot_apply_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], isolation_mode: str, told: bool
) -> None:
    """In the study's process (the CPU default) a hung trial cannot be stopped: a trial_timeout the
    user set is then said not to apply, rather than ignored in silence."""
    from tests.study.test_study import run_cli

    path = write_study(tmp_path, "tests.tasks:blobs", batch_sizes=(16,), trial_timeout=30)
    path.write_text(
        path.read_text()
        .replace("isolation: process", f"isolation: {isolation_mode}")
        .replace("trials: 4", "trials: 1")
        .replace("top: 1", "top: 0")  # the notice is the preparation's: no confirmation needed
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0
    notice = "budget.trial_timeout (30 s) does not apply: trials run in this process"
    assert (err.count(notice) == 1) if told else (notice not in err), err
