"""A trial process kept warm between trials: the same trials as a fresh child, replaced after a
failure or a leak, a pruned trial stopped inside it, and nothing left when the study ends."""

from __future__ import annotations

import dataclasses
import gc
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autotune.runners import isolation, trial_process, warm
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from tests.runners.test_isolation import alive, children, still_alive
from tests.runners.test_isolation import write_study as write_process_study
from tests.tasks import OOM_BATCH, blobs

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits(target=0.9, max_epochs=2, max_seconds=5, eval_every=0.5)
CPU = torch.device("cpu")


def config(batch_size: int) -> TrialConfig:
    return TrialConfig.from_mapping(
        complete({**DEFAULT_BASELINE, "batch_size": batch_size, "lr": 0.1})
    )


def kept(task: str, *, hang_after: float = 60) -> warm.WarmChild:
    return warm.WarmChild(
        f"tests.tasks:{task}",
        study_path=REPO / "study.yaml",
        hang_after=hang_after,
        measure_hang_after=hang_after,
    )


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports in the child


def test_one_warm_child_trains_trial_after_trial_as_this_process_would() -> None:
    child = kept("blobs")
    here = isolation.in_process(blobs())(config(32), limits=LIMITS, device=CPU, seed=7)
    pids, steps = [], []
    for _ in range(3):
        there = child.run_trial(
            config(32),
            limits=LIMITS,
            device=CPU,
            seed=7,
            progress=lambda s, t, m, seconds, paused: steps.append(s),
        )
        pids.append(child.pid)
        assert [point[1:] for point in there.curve] == [point[1:] for point in here.curve]
        assert there.optimizer_steps == here.optimizer_steps
    # one process served all three
    assert len(set(pids)) == 1 and alive(pids[0]) and child.replaced == []
    assert steps  # progress came back from the child
    child.close()
    assert still_alive(pids) == []


@pytest.mark.parametrize(
    ("task", "reason", "oom"),
    [
        ("hangs", "timeout: no result after 1 s", False),
        ("exits", "crashed: the trial's process exited with status 3", False),
        ("segfaults", "crashed: the trial's process was killed by SIGSEGV", False),
        ("allocator_oom", "out of memory: RuntimeError", True),
        ("calls_sys_exit", "SystemExit: 3", False),
    ],
)
def test_a_trial_that_fails_is_reasoned_and_the_next_trial_gets_a_new_child(
    task: str, reason: str, oom: bool
) -> None:
    """What a fresh child per trial promises, kept: the failure is the same, and whatever the
    failed trial did to its process (a fragmented allocator, a half-built state) is gone."""
    child = kept(task)
    child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    first = child.pid
    # the failing trial's own limit: 1 s for the hang to wait out (the child is up by now); the
    # others fail at once, and get room for that on a busy machine
    child.hang_after = 1 if task == "hangs" else 25
    started = time.monotonic()
    with pytest.raises(isolation.TrialFailure) as failure:
        child.run_trial(config(OOM_BATCH), limits=LIMITS, device=CPU, seed=1)
    assert time.monotonic() - started < 30  # the hang was killed at its limit
    child.hang_after = 60  # the next trial starts a new child, which takes longer on a busy machine
    assert failure.value.reason.startswith(reason), failure.value.reason
    assert failure.value.oom == oom
    assert child.pid is None and still_alive([first]) == []
    assert len(child.replaced) == 1 and reason.split(":")[0] in child.replaced[0]
    child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    assert child.pid not in (None, first)
    child.close()


def test_a_pruned_trial_is_stopped_inside_the_child_which_then_runs_the_next() -> None:
    child = kept("blobs")
    child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    pid, reports = child.pid, []

    def prune_at_the_third_report(
        steps: int, total: int, metric: float | None, seconds: float, paused: float
    ) -> None:
        reports.append(steps)
        if len(reports) == 3:
            raise isolation.Pruned("pruned: slower than the best")

    # minutes, were it not stopped
    long = Limits(target=2.0, max_epochs=10_000, max_seconds=300, eval_every=1.0)
    started = time.monotonic()
    with pytest.raises(isolation.Pruned):
        child.run_trial(
            config(32), limits=long, device=CPU, seed=1, progress=prune_at_the_third_report
        )
    assert time.monotonic() - started < 30
    assert child.pid == pid and child.replaced == []
    result = child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    assert child.pid == pid and result.optimizer_steps > 0
    child.close()


def test_a_trial_that_leaves_a_process_running_gets_its_child_replaced_and_the_process_killed() -> (
    None
):
    told: list[str] = []
    child = warm.WarmChild(
        "tests.tasks:leaves_a_process",
        study_path=REPO / "study.yaml",
        hang_after=60,
        measure_hang_after=60,
        notice=told.append,
    )
    child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    assert child.pid is None and len(child.replaced) == 1, child.replaced
    assert "left 1 process(es) running" in child.replaced[0]
    # the user hears of it
    assert told == [f"the warm trial process was replaced: {child.replaced[0]}"]
    left = [int(pid) for pid in re.findall(r"\d+", child.replaced[0].split("pid", 1)[1])]
    assert still_alive(left) == []  # killed with the child's process group
    child.close()


def test_what_a_trial_leaves_decides_whether_its_child_serves_again() -> None:
    footprint = warm._Footprint
    before, first = footprint(1 << 20, 500 << 20, [17]), footprint(1 << 20, 600 << 20, [17])
    # 17 was there before
    assert warm.left_behind(before, first, footprint(1 << 20, 700 << 20, [17])) is None
    assert "device memory" in warm.left_behind(before, first, footprint(200 << 20, 600 << 20, []))
    assert "process(es)" in warm.left_behind(before, first, footprint(1 << 20, 600 << 20, [4242]))
    assert "resident memory grew by 2048 MiB" in warm.left_behind(
        before, first, footprint(1 << 20, 2648 << 20, [])
    )


def test_a_child_serves_at_most_its_share_of_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is read in the child, which the fork server made before this test could patch
    it: the serving loop runs here instead, on a pipe that hands it three trials."""
    replies = []

    class Connection:
        requests = [("work", lambda task, progress: "done", (), CPU)] * 3

        def recv(self):
            if not self.requests:
                raise EOFError
            request, self.requests = self.requests[0], self.requests[1:]
            return request

        def send(self, reply):
            replies.append(reply)

        def poll(self):
            return False

    monkeypatch.setattr(warm, "TRIALS_PER_CHILD", 2)
    monkeypatch.setattr(trial_process, "become_trial_process", lambda pid, method: None)
    monkeypatch.setattr(warm, "load_task", lambda name, study_path: blobs())
    # the test process's own objects stay collectable
    monkeypatch.setattr(gc, "freeze", lambda: None)
    warm._serve(Connection(), 0, "fork", "blobs", REPO / "study.yaml")
    assert [reply[:2] for reply in replies] == [("result", "done"), ("result", "done")]
    assert replies[0][2] is None and "2 trials" in replies[1][2]


def test_a_trial_with_cudnn_s_search_runs_where_no_earlier_trial_searched() -> None:
    """cuDNN keeps the algorithms it found for the process: a second trial with its search in the
    same child would find them, not pay for the search as a run of its own. Trials without it
    share the child as ever."""
    child = kept("blobs")
    searching = dataclasses.replace(config(32), cudnn_benchmark=True)
    pids = []
    for trial in (config(32), searching, config(32), searching, searching):
        child.run_trial(trial, limits=LIMITS, device=CPU, seed=1)
        pids.append(child.pid)
    # the first search in the child the plain trials share, each later one in a child of its own
    assert pids[0] == pids[1] == pids[2] != pids[3] != pids[4] and len(set(pids)) == 3
    assert child.replaced == ["an earlier trial in it had searched cuDNN's algorithms"] * 2
    child.close()


def test_dropping_the_warm_child_ends_its_process() -> None:
    child = kept("blobs")
    child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    pid = child.pid
    del child
    gc.collect()
    assert still_alive([pid]) == []


def write_study(folder: Path, task: str, **kwargs: object) -> Path:
    """test_isolation's study, its trials in a warm child."""
    path = write_process_study(folder, task, **kwargs)
    path.write_text(path.read_text().replace("isolation: process", "isolation: warm"))
    return path


def test_killing_a_warm_study_leaves_no_trial_process_behind(tmp_path: Path) -> None:
    path = write_study(tmp_path, "tests.tasks:hangs", batch_sizes=(OOM_BATCH,))  # every trial hangs
    study = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline, descendants = time.monotonic() + 120, []
    while (
        time.monotonic() < deadline and not descendants
    ):  # the fork server, and under it the warm child
        descendants = [
            grandchild for child in children(study.pid) for grandchild in children(child)
        ]
        time.sleep(0.2)
    assert descendants, "no trial process appeared"
    time.sleep(1.0)
    study.send_signal(signal.SIGKILL)
    study.wait()
    assert still_alive(descendants) == [], "a trial process outlived the study"


def test_what_a_trial_sets_for_the_whole_process_is_put_back_before_the_next() -> None:
    """A trial that leaves float64 as torch's default dtype and one thread: the next trial in the
    same child builds its model in float32 with the threads it had, as a fresh child would."""
    child = kept("sets_float64")
    first = child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    pid = child.pid
    again = child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    assert child.pid == pid and child.replaced == []
    assert [point[1:] for point in again.curve] == [point[1:] for point in first.curve]
    child.close()


@pytest.mark.parametrize(
    ("task", "trials", "reason"),
    [
        ("leaves_a_thread", 1, "a trial left 1 thread(s) running"),
        ("leaves_descriptors", 2, "a trial left 40 more file descriptors open"),
    ],
)
def test_a_trial_that_leaves_threads_or_descriptors_gets_its_child_replaced(
    task: str, trials: int, reason: str
) -> None:
    """A thread left running slows every later trial in the process; descriptors left open run
    it out of them. The first trial's descriptors set the mark (a device's are opened for good)."""
    child = kept(task)
    for _ in range(trials - 1):
        child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
        assert child.pid is not None and child.replaced == []
    child.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    assert child.pid is None and len(child.replaced) == 1, child.replaced
    assert child.replaced[0].startswith(reason), child.replaced
    child.close()
