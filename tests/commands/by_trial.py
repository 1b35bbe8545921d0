"""A training command whose behaviour depends on the trial it is (its --seed ends in the trial
number): trial 1 climbs slowly and would reach the target late, trial 2 runs out of memory at once,
every other trial reaches the target in about half a second. Writes its pid to
--pids DIR/<trial>."""

from __future__ import annotations

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--pids", required=True)
parser.add_argument("--batch-size", type=int)  # named so that autotune searches it; unused
args = parser.parse_args()
trial = args.seed % 100_000  # autotune's trial seed is study seed * 100000 + trial number
with open(os.path.join(args.pids, f"{trial}-{os.getpid()}"), "w"):
    pass

if trial == 2:
    # At once, before importing torch: a command's clock runs from its launch, and one slower to
    # start than trial 0's whole run would be pruned as unable to win before it could run out.
    # A RuntimeError with the allocator's words, as torch raised CUDA OOMs before OutOfMemoryError.
    raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

import autotune  # noqa: E402 - after the early exit above

pace = 0.5 if trial == 1 else 0.05  # seconds per 0.1 of accuracy: trial 1 needs about 5 s
for step in range(1, 11):
    time.sleep(pace)
    autotune.report(step=step, metric=step / 10, total_steps=10)
