"""A training command on several devices, for tests/runners/test_command_devices.py: run by
torch.distributed's launcher, one process a rank, joined with gloo on the CPU.

Every rank reports through autotune.report (only rank 0's reports reach autotune): rank 0 the
metric climbing to 1.0 in five steps, the others 0.0. Each step all-reduces a one, so a rank that
did not join its group fails. `FAIL_RANK`: that rank raises CUDA's out-of-memory error at step 2;
`HANG_RANK`: that rank stops taking part, and the others wait in the collective. `--out DIR`:
each rank writes its pid to DIR/rank-N. `STEP_SECONDS`: each step's length (default 0.2).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import autotune


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    (out / f"rank-{rank}").write_text(str(os.getpid()))
    for step in range(1, 6):
        if os.environ.get("FAIL_RANK") == str(rank) and step == 2:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (rank failed on purpose)"
            )
        if os.environ.get("HANG_RANK") == str(rank) and step == 2:
            time.sleep(3600)
        ones = torch.ones(1)
        dist.all_reduce(ones)
        assert ones.item() == world, (ones.item(), world)
        time.sleep(float(os.environ.get("STEP_SECONDS", "0.2")))
        autotune.report(step=step, metric=step / 5 if rank == 0 else 0.0, samples=step * 32 * world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
