"""The seed scheme: no two runs of a study share a seed, whatever they are, and the scheme is the
same for a study stored before it had one home (its figures are stored with every trial)."""

from __future__ import annotations

from autotune.record import seeds


def test_no_two_runs_of_a_study_share_a_seed() -> None:
    study_seed, trials, replicates, confirmation_runs = 7, 2000, 3, 20
    trial_runs = [
        s
        for n in range(trials)
        for s in seeds.replicates(seeds.for_trial(study_seed, n), replicates)
    ]
    others = [
        *seeds.fresh(study_seed, confirmation_runs),
        seeds.for_probe(study_seed),
    ]
    every = trial_runs + others
    assert len(set(every)) == len(every)
    # and nothing of the next study seed's block either
    neighbour = {seeds.for_trial(study_seed + 1, n) for n in range(trials)} | set(
        seeds.fresh(study_seed + 1, confirmation_runs)
    )
    assert not neighbour & set(every)


def test_the_scheme_keeps_the_seeds_stored_studies_ran_on() -> None:
    assert seeds.for_trial(3, 12) == 300_012
    assert seeds.replicates(300_012, 2) == [300_012, 300_012 + 10**12]
    assert seeds.fresh(3, 2) == [350_000, 350_001]
    assert seeds.for_probe(3) == 390_000


def test_paired_trials_share_their_seeds_and_others_do_not() -> None:
    assert {seeds.for_trial(7, n, paired=True) for n in range(4)} == {700_000}
    assert len({seeds.for_trial(7, n) for n in range(4)}) == 4


def test_a_resumed_study_and_each_worker_draw_apart() -> None:
    drawn = {
        seeds.for_sampler(1, stored_trials=stored, worker=worker)
        for stored in (0, 5)
        for worker in (None, 1, 2)
    }
    assert len(drawn) == 6
    assert seeds.for_sampler(1, stored_trials=5, worker=None) == seeds.for_sampler(
        1, stored_trials=5, worker=0
    )
    # numpy's seeds are 32-bit
    assert seeds.for_sampler(2**32 - 1, stored_trials=1, worker=None) == 0
