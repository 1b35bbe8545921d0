"""A training command that stops reporting: trial 0 reaches the target in about half a second;
every other trial reports once, then trains for 30 s without a word before it would reach it."""

from __future__ import annotations

import argparse
import time

import autotune

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
args = parser.parse_args()
if args.seed % 100_000 == 0:  # autotune's trial seed is study seed * 100000 + trial number
    for step in range(1, 11):
        time.sleep(0.05)
        autotune.report(step=step, metric=step / 10, total_steps=10)
else:
    autotune.report(step=1, metric=0.1, total_steps=10)
    time.sleep(30)
    autotune.report(step=10, metric=1.0, total_steps=10)
