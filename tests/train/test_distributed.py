"""A run on several devices: each rank loads its own shard of every epoch, and two ranks at a
per-device batch of b train exactly what one process trains at 2b (DistributedDataParallel
averages the ranks' gradients once per optimizer step, after the last micro-batch). On the CPU,
with gloo and 2 processes."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from autotune.runners.distributed import free_port
from autotune.train.config import Limits, TrialConfig
from autotune.train.loader import endless, make_loader
from autotune.train.ranks import ALONE, Ranks, joined
from autotune.train.tasks import Task
from autotune.train.training import build, seed_everything

CPU = torch.device("cpu")
LIMITS = Limits(target=2.0, max_epochs=4, max_seconds=60, eval_every=1.0)
SEED = 7
STEPS = 6  # optimizer steps compared: within the first epoch
BATCH = 16  # per device


def config(batch_size: int, accumulation_steps: int) -> TrialConfig:
    return TrialConfig(
        lr=0.2,
        scheduler="cosine",
        batch_size=batch_size,
        accumulation_steps=accumulation_steps,
        num_workers=0,
        prefetch_factor=None,
        pin_memory=False,
        precision="fp32",
    )


def _data(n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(torch.eye(4, 8)[labels] * 3 + torch.randn(n, 8, generator=g), labels)


def _model() -> nn.Module:
    """No BatchNorm: its statistics are per rank, and would make the ranks' maths differ."""
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def task() -> Task:
    return Task(model=_model, train=_data(), val=_data(64))


def _train(training, steps: int, accumulation: int) -> list[list[tuple[torch.Tensor, ...]]]:
    """Take `steps` optimizer steps as trial.run does; the micro-batches each one saw."""
    batches, seen = endless(training.loader), []
    try:
        for _ in range(steps):
            group = list(itertools.islice(batches, accumulation))
            training.step(group)
            training.scheduler.step()
            seen.append(group)
    finally:
        batches.close()
    return seen


def _rank(rank: int, world_size: int, port: int, accumulation: int, out: str) -> None:
    """One of two ranks: STEPS steps at BATCH per device; its batches, its parameters and the
    gradient all-reduces it took saved."""
    with joined(rank, world_size, port=port, device=CPU) as ranks:
        seed_everything(SEED)
        training = build(
            task(), config(BATCH, accumulation), limits=LIMITS, device=CPU, seed=SEED, ranks=ranks
        )
        reduces = []

        def counted(state, bucket):  # unannotated: DDP checks annotations as objects
            reduces.append(bucket.index())
            return default_hooks.allreduce_hook(None, bucket)

        training.step.args[0].register_comm_hook(None, counted)  # the DDP module trained
        seen = _train(training, STEPS, accumulation)
        parameters = [p.detach().clone() for p in training.evaluated.parameters()]
    torch.save(
        {"seen": seen, "parameters": parameters, "reduces": reduces}, Path(out) / f"rank{rank}.pt"
    )


@pytest.mark.parametrize("accumulation", [1, 2])
def test_two_ranks_train_what_one_process_trains_at_twice_the_batch(
    tmp_path: Path, accumulation: int
) -> None:
    torch.multiprocessing.spawn(
        _rank, args=(2, free_port(), accumulation, str(tmp_path)), nprocs=2, join=True
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # Both ranks hold the same parameters, and each loaded other samples than the other.
    for p0, p1 in zip(ranks[0]["parameters"], ranks[1]["parameters"]):
        assert torch.equal(p0, p1)
    first = [set(map(tuple, r["seen"][0][0][0].tolist())) for r in ranks]
    assert not first[0] & first[1]
    # One all-reduce of the gradients per optimizer step (the model is one bucket), however many
    # micro-batches it took: the others ran under no_sync.
    assert ranks[0]["reduces"] == [0] * STEPS

    # One process at 2 x BATCH on the union of the ranks' micro-batches, from the same start.
    seed_everything(SEED)
    alone = build(task(), config(2 * BATCH, accumulation), limits=LIMITS, device=CPU, seed=SEED)
    for step in range(STEPS):
        group = [
            tuple(torch.cat([r["seen"][step][j][k] for r in ranks]) for k in range(2))
            for j in range(accumulation)
        ]
        alone.step(group)
        alone.scheduler.step()
    for ours, theirs in zip(alone.evaluated.parameters(), ranks[0]["parameters"]):
        torch.testing.assert_close(ours.detach(), theirs, rtol=1e-5, atol=1e-5)
    # and training moved them: the comparison is not of two untouched models
    seed_everything(SEED)
    untouched = list(_model().parameters())
    assert not torch.allclose(untouched[0], ranks[0]["parameters"][0])


def test_each_rank_loads_its_own_shard_of_every_epoch_reshuffled_each_epoch() -> None:
    data = _data(96)
    epochs = {}
    for rank in range(2):
        loader = make_loader(data, config(8, 1), seed=SEED, device=CPU, ranks=Ranks(rank, 2))
        batches = endless(loader)
        per_epoch = len(loader)
        labels = [torch.cat([next(batches)[0] for _ in range(per_epoch)]) for _ in range(2)]
        batches.close()
        epochs[rank] = [set(map(tuple, x.tolist())) for x in labels]
    for epoch in range(2):
        # the ranks' shards are apart and together the whole epoch
        assert not epochs[0][epoch] & epochs[1][epoch]
        assert epochs[0][epoch] | epochs[1][epoch] == set(map(tuple, data.tensors[0].tolist()))
    assert epochs[0][0] != epochs[0][1]  # set_epoch: a new shuffle, a new shard


class _Keyed(TensorDataset):
    """A dataset that takes keys (tasks.augmentation_rng): it returns the index it was given."""

    keyed = True

    def __getitem__(self, item: tuple[int, int]):
        index, _key = item
        return torch.tensor(index), self.tensors[1][index]


def test_keyed_shards_together_are_one_process_s_effective_batches() -> None:
    data = _Keyed(torch.zeros(100, 1), torch.zeros(100, dtype=torch.long))
    alone = [
        b[0]
        for b in itertools.islice(endless(make_loader(data, config(8, 1), seed=3, device=CPU)), 12)
    ]
    shards = [
        [
            b[0]
            for b in itertools.islice(
                endless(make_loader(data, config(4, 1), seed=3, device=CPU, ranks=Ranks(r, 2))),
                12,
            )
        ]
        for r in range(2)
    ]
    assert alone[0].shape == (8,) and shards[0][0].shape == (4,)
    for step in range(12):  # across the epoch boundary too
        union = torch.cat([shards[0][step], shards[1][step]])
        assert sorted(union.tolist()) == sorted(alone[step].tolist())


def test_one_device_asks_nothing_of_torch_distributed() -> None:
    assert not ALONE.several and ALONE.main
    assert ALONE.agree(True) is True
    assert ALONE.from_main(lambda: 3) == 3
    model = _model()
    assert ALONE.wrap(model, CPU) is model


def test_the_ddp_knobs_reach_distributed_data_parallel() -> None:
    """build hands the configuration's DDP knobs to the module it wraps; left at their defaults,
    DDP's own. One process, as rank 0 of 2 for Ranks (so that it wraps) in a gloo group of one
    (so that DDP's constructor has no peer to wait for)."""
    tuned = dataclasses.replace(
        config(BATCH, 1),
        ddp_bucket_cap_mb=7,
        ddp_gradient_as_bucket_view=True,
        ddp_static_graph=True,
    )
    address = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    try:
        ranks = Ranks(rank=0, world_size=2)
        training = build(task(), tuned, limits=LIMITS, device=CPU, seed=SEED, ranks=ranks)
        wrapped = training.step.args[0]  # the module train_step runs
        assert isinstance(wrapped, DistributedDataParallel)
        assert wrapped.bucket_bytes_cap == 7 * 2**20
        assert wrapped.gradient_as_bucket_view is True and wrapped.static_graph is True
        for default in (ranks.wrap(_model(), CPU, config(BATCH, 1)), ranks.wrap(_model(), CPU)):
            assert isinstance(default, DistributedDataParallel)
            assert default.bucket_bytes_cap == 25 * 2**20
            assert default.gradient_as_bucket_view is False and default.static_graph is False
    finally:
        dist.destroy_process_group()
