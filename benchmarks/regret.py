"""The regret benchmark's table: every strategy's `found.py --oracle` results side by side.

Reads benchmarks/results/found-<study>-*[-load]-regret-<device>.json (written by found.py) and
prints one Markdown row per strategy and machine state, as docs/benchmarks.md shows them. Usage:

    .venv/bin/python benchmarks/regret.py [--study digits] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.found_report import PLAIN_TPE, RESULTS_NAME  # noqa: E402
from benchmarks.provenance import RESULTS  # noqa: E402

ORDER = ("time_to_target", "goodput", "systems_only", PLAIN_TPE)  # the docs' order


def rows(study: str, device: str) -> list[dict]:
    """One row per results file: its strategy, whether loaded, and the figures the docs table
    shows."""
    found = []
    for path in sorted(RESULTS.glob(f"found-{study}-*-regret-{device}.json")):
        match = RESULTS_NAME.fullmatch(path.name)
        if match is None or match["study"] != study or match["device"] != device:
            continue
        record = json.loads(path.read_text())
        studies = record["studies"]
        if not studies:
            continue
        summary = record["summary"]
        found.append(
            {
                "strategy": match["strategy"],
                "loaded": bool(match["load"]),
                "file": path.name,
                "studies": len(studies),
                "median_regret": summary["median_regret"],
                "within_10": summary["within_10"],
                "not_worse": summary["not_worse"],
                "median_speedup": summary["median_speedup"],
                "median_compute": summary["median_compute"],
                "median_prediction_error": summary.get("median_prediction_error"),
                "oracle_over_baseline": statistics.median(
                    r["baseline_median"] / r["oracle_median"]
                    for r in studies
                    if r.get("oracle_median") and r.get("baseline_median")
                ),
            }
        )
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(
        found, key=lambda r: (r["loaded"], rank.get(r["strategy"], len(ORDER)), r["strategy"])
    )


def table(found: list[dict]) -> str:
    """Markdown: compute is also shown against plain TPE's in the same machine state."""
    plain = {r["loaded"]: r["median_compute"] for r in found if r["strategy"] == PLAIN_TPE}
    lines = [
        "| strategy | machine | studies | median regret | within 10% | at or below the baseline "
        "| median speedup | oracle over baseline | median compute (s) | compute / plain TPE's "
        "| median predicted-vs-measured error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        against = plain.get(r["loaded"])
        ratio = f"{r['median_compute'] / against:.2f}" if against else "-"
        error = (
            "-" if r["median_prediction_error"] is None else f"{r['median_prediction_error']:.0%}"
        )
        regret = (
            "missed" if r["median_regret"] in (None, float("inf")) else f"{r['median_regret']:.2f}x"
        )
        lines.append(
            f"| {r['strategy']} | {'loaded' if r['loaded'] else 'quiet'} | {r['studies']} "
            f"| {regret} | {r['within_10']} of {r['studies']} | {r['not_worse']} of {r['studies']} "
            f"| {r['median_speedup']:.2f}x | {r['oracle_over_baseline']:.2f}x "
            f"| {r['median_compute']:.0f} | {ratio} | {error} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--study", default="digits")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    found = rows(args.study, args.device)
    if not found:
        raise SystemExit(
            f"no found-{args.study}-*-regret-{args.device}.json in {RESULTS}: "
            "run found.py --oracle first"
        )
    print(table(found))


if __name__ == "__main__":
    main()
