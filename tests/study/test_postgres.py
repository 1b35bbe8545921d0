"""The PostgreSQL test harness works: workers with their own connections share a study there."""

from __future__ import annotations

import threading

import optuna
from optuna.trial import TrialState


def test_two_workers_share_a_study_on_postgres(postgres_url: str) -> None:
    optuna.create_study(study_name="harness", storage=optuna.storages.RDBStorage(postgres_url))
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(name: str, n_trials: int) -> None:
        try:
            # Each worker has its own storage, so its own engine and connections, as a machine
            # would.
            study = optuna.load_study(
                study_name="harness", storage=optuna.storages.RDBStorage(postgres_url)
            )
            start.wait(timeout=30)

            def objective(trial: optuna.Trial) -> float:
                trial.set_user_attr("worker", name)
                return trial.suggest_float("x", -1.0, 1.0) ** 2

            study.optimize(objective, n_trials=n_trials)
        except BaseException as error:  # noqa: BLE001 - re-raised by the test below
            errors.append(error)

    threads = [
        threading.Thread(target=worker, args=("a", 2)),
        threading.Thread(target=worker, args=("b", 1)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)

    trials = optuna.load_study(study_name="harness", storage=postgres_url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert sorted(t.user_attrs["worker"] for t in trials) == ["a", "a", "b"]
