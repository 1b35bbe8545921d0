"""scikit-learn's digits with a small CNN, trained by Lightning: a script autotune tunes from
outside.

autotune runs it as the study's command (studies/lightning_digits.yaml), with the trial's
settings as command-line flags named after the knobs, and reads the validation accuracy that
`AutotuneReport` passes to `autotune.report` after each validation. Run by hand it trains once and
prints its accuracy (autotune.report then does nothing):

    python train.py --lr 0.05 --batch-size 64 --scheduler onecycle
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import warnings

# Lightning's own deprecation notice at import, about its use of torch: not this script's to fix.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import autotune

# autotune's precisions with Lightning's names for them, and its optimizer and LR schedules: the
# knobs mean here what they mean in autotune's own trials.
from autotune.search.knob import PRECISIONS
from autotune.search.space import SCHEDULERS
from autotune.train.tasks import sgd
from autotune.train.training import make_scheduler

VAL_FRACTION = 0.2
# the split is part of the task, not of a trial: the same validation set for every trial
SPLIT_SEED = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate per optimizer step")
    p.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default="constant",
        help="stepped once per optimizer step",
    )
    p.add_argument(
        "--batch-size", type=int, default=32, help="micro-batch: samples per forward/backward"
    )
    p.add_argument(
        "--accumulation-steps", type=int, default=1, help="micro-batches per optimizer step"
    )
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument(
        "--prefetch-factor", type=int, default=None, help="batches each worker loads ahead"
    )
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--precision", choices=list(PRECISIONS), default="fp32")
    p.add_argument(
        "--max-epochs", type=float, default=8, help="training length, also the LR schedule's"
    )
    p.add_argument("--eval-every", type=float, default=0.25, help="epochs between validations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    return p.parse_args(argv)


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0  # 8x8, one channel
    images = (images - images.mean()) / images.std()
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = order[: int(len(labels) * VAL_FRACTION)], order[int(len(labels) * VAL_FRACTION) :]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


class DigitsCNN(L.LightningModule):
    def __init__(self, *, lr: float, scheduler: str, total_steps: int) -> None:
        super().__init__()
        self.lr, self.scheduler_name, self.total_steps = lr, scheduler, total_steps
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        )
        self.correct = self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        inputs, targets = batch
        # Lightning divides it by the accumulation steps
        return F.cross_entropy(self(inputs), targets)

    def on_validation_epoch_start(self) -> None:
        self.correct = self.seen = 0

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        inputs, targets = batch
        self.correct += int((self(inputs).argmax(dim=1) == targets).sum())
        self.seen += len(targets)

    def on_validation_epoch_end(self) -> None:
        self.log("val_accuracy", self.correct / max(1, self.seen))

    def configure_optimizers(self) -> dict:
        optimizer = sgd(self.parameters(), self.lr)
        scheduler = make_scheduler(
            self.scheduler_name, optimizer, total_steps=self.total_steps, lr=self.lr
        )
        return {
            "optimizer": optimizer,
            # once per optimizer step, never per micro-batch
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class AutotuneReport(L.Callback):
    """Tells autotune the validation accuracy after each validation, and progress after each
    step."""

    def __init__(self, n_train: int) -> None:
        self.n_train, self.samples, self.last_step = n_train, 0, -1

    def on_train_batch_end(
        self, trainer: L.Trainer, _: L.LightningModule, __: object, batch: tuple, ___: int
    ) -> None:
        self.samples += len(batch[1])
        if trainer.global_step != self.last_step:  # a progress report per optimizer step
            self.last_step = trainer.global_step
            autotune.report(
                step=trainer.global_step, samples=self.samples, total_steps=trainer.max_steps
            )

    def on_validation_end(self, trainer: L.Trainer, _: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        accuracy = float(trainer.callback_metrics["val_accuracy"])
        autotune.report(
            step=trainer.global_step,
            metric=accuracy,
            epoch=self.samples / self.n_train,
            samples=self.samples,
            total_steps=trainer.max_steps,
        )
        print(f"step {trainer.global_step}: val_accuracy {accuracy:.4f}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet()
    L.seed_everything(args.seed, workers=True, verbose=False)
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    torch.set_num_threads(max(1, cores - args.num_workers))  # loader workers get their own cores
    train, val = datasets()
    workers = args.num_workers
    train_loader = DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        prefetch_factor=args.prefetch_factor if workers > 0 else None,
        persistent_workers=workers > 0,  # otherwise every epoch pays worker start-up again
        pin_memory=args.pin_memory and args.device.startswith("cuda"),
    )
    # one batch, in this process: validation is on the clock
    val_loader = DataLoader(val, batch_size=len(val))
    # Lightning steps the optimizer at the end of an epoch even mid-accumulation.
    steps_per_epoch = math.ceil(len(train_loader) / args.accumulation_steps)
    total_steps = max(1, math.floor(args.max_epochs * steps_per_epoch))
    accelerator, devices = (
        ("cpu", 1) if args.device == "cpu" else ("gpu", [torch.device(args.device).index or 0])
    )
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=devices,
        precision=PRECISIONS[args.precision].lightning,
        max_steps=total_steps,
        max_epochs=-1,
        accumulate_grad_batches=args.accumulation_steps,
        val_check_interval=min(1.0, args.eval_every),  # a fraction of an epoch, or every epoch...
        check_val_every_n_epoch=max(1, round(args.eval_every)),  # ...of every n-th
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[AutotuneReport(len(train))],
    )
    trainer.fit(
        DigitsCNN(lr=args.lr, scheduler=args.scheduler, total_steps=total_steps),
        train_loader,
        val_loader,
    )


def quiet() -> None:
    """No banners, tips or warnings about this small example's own choices."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")


if __name__ == "__main__":
    main()
