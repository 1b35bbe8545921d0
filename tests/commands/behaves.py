"""A training command that behaves as its first argument says, for tests/runners/test_command.py.

Most modes speak the reporting protocol by hand (a JSON line on $AUTOTUNE_REPORT_FD), as a script
in another language would, and so start fast without importing torch; `climbs` and `oom` go
through autotune.report / torch. `--out FILE` receives this process's pid (and what `echo` saw).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def send(line: str) -> None:
    os.write(int(os.environ["AUTOTUNE_REPORT_FD"]), (line + "\n").encode())


def report(**values: object) -> None:
    send(json.dumps(values))


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    out = args[args.index("--out") + 1] if "--out" in args else None
    info: dict[str, object] = {"pid": os.getpid()}
    emit = report
    if mode == "plateau_py":  # plateau, through autotune's Python helper (which watches the study)
        import autotune

        mode, emit = "plateau", autotune.report
    if mode == "plateau":  # a helper process in the same group, as DataLoader workers are
        info["helper"] = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"]
        ).pid
    if mode in (
        "daemons",
        "daemons_exit",
    ):  # helpers that leave the command's group: setsid(), and a double fork
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        info["setsid"] = subprocess.Popen(sleeper, start_new_session=True).pid
        middle = subprocess.run(
            [
                sys.executable,
                "-c",
                "import subprocess, sys; print(subprocess.Popen("
                f"{sleeper!r}, start_new_session=True, stdout=subprocess.DEVNULL).pid)",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        info["orphan"] = int(middle.stdout)  # its parent has exited: it is nobody's child now
    if mode == "echo":
        info.update(
            argv=args,
            config=json.loads(open(os.environ["AUTOTUNE_CONFIG"]).read()),
            config_file=os.environ["AUTOTUNE_CONFIG"],
            env=os.environ.get("WIDTH_FROM_ENV"),
            unset=os.environ.get("UNSET_FROM_ENV"),
        )
    if out:
        with open(out + ".tmp", "w") as file:
            json.dump(info, file)
        os.replace(out + ".tmp", out)  # whole, for a test polling for it

    if mode == "climbs":  # 0.05 more accuracy each 0.05 s, through the Python helper
        import autotune

        for step in range(1, 1001):  # 50 s if it were waited for
            time.sleep(0.05)
            assert (
                autotune.report(
                    step=step, metric=step / 20, epoch=step / 10, samples=32 * step, total_steps=20
                )
                is None
            )
    elif mode == "plateau":  # never better than 0.1
        for step in range(1, 10**6):
            time.sleep(0.1)
            emit(step=step, metric=0.1, total_steps=10**6)
    elif mode == "short":  # runs its schedule to the end, short of any sensible target
        for step, metric in enumerate((0.1, 0.3, 0.2), start=1):
            report(step=step, metric=metric, epoch=step)
    elif mode == "progress_only":  # reports, but never a metric
        report(step=1, total_steps=2)
        report(step=2, total_steps=2)
    elif mode == "crashes":
        for i in range(30):
            print(f"stderr line {i}", file=sys.stderr)
        sys.exit(3)
    elif mode == "segfaults":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode == "oom":
        import torch

        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    elif mode == "hangs":
        time.sleep(600)
    elif mode == "garbage":  # what a careless script might put on the descriptor, then the target
        for line in (
            "loading data...",
            "[1, 2]",
            '{"step": ',
            '{"step": "one", "metric": "high"}',
            '{"step": 3, "metric": true}',
            '{"step": 4}',
            '{"step": 5, "metric": null, "accuracy": 0.4}',
        ):
            send(line)
        report(step=6, metric=0.9)
        time.sleep(600)
    elif mode == "malformed":  # only lines that are no report, then a clean exit
        for line in ("epoch 1: accuracy 0.93", "{'metric': 0.93}"):
            send(line)
    elif mode == "diverges":  # a finite metric, then NaN, as a diverging run reports it
        report(step=1, metric=0.3)
        send('{"step": 2, "metric": NaN}')
        time.sleep(600)
    elif (
        mode == "chatty"
    ):  # megabytes on stdout and stderr, a progress bar's carriage returns, then the target
        for i in range(2000):
            sys.stdout.write("x" * 1000 + "\n")
            sys.stderr.write(f"\r{i} " + "y" * 1000)
        sys.stdout.flush()
        sys.stderr.flush()
        report(step=1, metric=1.0)
        time.sleep(600)
    elif mode == "echo":
        report(step=1, metric=1.0)
        time.sleep(600)
    elif mode == "daemons":  # the target, then on training (it is stopped)
        report(step=1, metric=1.0)
        time.sleep(600)
    elif mode == "daemons_exit":  # the target, then an exit of its own, its helpers left behind
        report(step=1, metric=1.0)
    elif mode == "plain":  # no autotune around: report must do nothing
        import autotune

        assert "AUTOTUNE_REPORT_FD" not in os.environ
        assert autotune.report(step=1, metric=0.5) is None
        print("reported nothing")
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
