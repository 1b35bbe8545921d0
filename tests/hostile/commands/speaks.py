"""A training command that writes to autotune's report descriptor as its first argument says.

Never imports torch: it starts in a few hundredths of a second.
"""

from __future__ import annotations

import json
import os
import sys


def send(data: bytes) -> None:
    os.write(int(os.environ["AUTOTUNE_REPORT_FD"]), data)


def main() -> None:
    mode = sys.argv[1]
    if mode == "garbage":  # binary noise, then exits 0 without a metric
        send(bytes(range(256)) * 64 + b"\n\xff\xfe\x00garbage\n")
    elif mode == "metric_text":  # the metric as a string
        send(json.dumps({"step": 1, "metric": "0.99"}).encode() + b"\n")
    elif mode == "metric_bool":  # the metric as true
        send(json.dumps({"step": 1, "metric": True}).encode() + b"\n")
    elif mode == "nan":  # NaN, in Python's JSON spelling
        send(b'{"step": 1, "metric": NaN}\n')
    elif mode == "huge_line":  # one report line of 4 MiB with no end
        send(b"{" + b" " * (4 << 20))
    elif mode == "good":
        send(json.dumps({"step": 1, "metric": 0.99}).encode() + b"\n")


if __name__ == "__main__":
    main()
