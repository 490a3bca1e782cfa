"""Benchmark: the model against published multi-GPU measurements (validation/published.toml).

    python -m bench.published_validation [--file validation/published.toml] [--rows]

For every published point (source, cluster, network, scheme, precision, batch, nodes x GPUs
per node): the published weak-scaling efficiency beside the model's prediction on the
described cluster (`analysis.published`), the error in points of efficiency and the
bottleneck the model names; beside it the model without the terms of the slowest worker,
the shared host link, coordination, pipelining and servers on the host CPU ("without"), and
one flat link of the NIC's speed without software cost ("flat").  Then per source and scheme
the median and the largest |error| of each, the targets (median <= 3 points and every point
within 10, over all sources), the sources with their citations, and how long the whole
validation took (target < 5 s).  Parameters come from spec sheets and the sources'
descriptions; nothing is fitted to a multi-GPU answer.  Runs in the launcher's environment
(re-executes itself there).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from core.cli import OneLineParser, fail
from core.envs import REPO_ROOT, reexec_in_host_env

MEDIAN_TARGET_POINTS = 3.0
MAX_TARGET_POINTS = 10.0
TIME_TARGET_S = 5.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="python -m bench.published_validation")
    parser.add_argument("--file", default=str(REPO_ROOT / "validation" / "published.toml"))
    parser.add_argument("--rows", action="store_true", help="also print every published point")
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.published_validation", argv)
    import pandas as pd  # after the re-exec: the launcher's environment has pandas

    from analysis import published, rendering

    started = time.perf_counter()
    try:
        sources, cases = published.load_cases(Path(args.file))
        rows = [row for case in cases for row in published.predict_case(case)]
    except published.PublishedError as error:
        return fail(error)
    elapsed = time.perf_counter() - started
    if args.rows:
        table = pd.DataFrame(rows).drop(columns=["model"])
        print(rendering.to_markdown(table.round({"published": 3, "predicted": 3, "without": 3, "flat": 3,
                                              "device_efficiency": 3, "error_points": 1,
                                              "without_error_points": 1, "flat_error_points": 1})))
        print()
    print(rendering.to_markdown(pd.DataFrame(published.summary(rows)).round(1)))
    median = published.median_abs_points(rows, "error_points")
    worst = published.max_abs_points(rows, "error_points")
    print(f"\nmodel: median |error| {median:.1f} points (target <= {MEDIAN_TARGET_POINTS:.0f}: "
          f"{'met' if median <= MEDIAN_TARGET_POINTS else 'NOT met'}), largest {worst:.1f} "
          f"(target <= {MAX_TARGET_POINTS:.0f}: {'met' if worst <= MAX_TARGET_POINTS else 'NOT met'}); "
          f"{len(rows)} published points, {len(sources)} sources")
    outside = [row for row in rows if abs(row["error_points"]) > MAX_TARGET_POINTS]
    for row in outside:
        print(f"  outside {MAX_TARGET_POINTS:.0f}: {row['source']} {row['scheme']} {row['precision']} "
              f"{row['topology']} b{row['batch_per_worker']}: published {row['published']:.3f}, "
              f"predicted {row['predicted']:.3f} ({row['error_points']:+.1f}), {row['bottleneck']}")
    for name, source in sources.items():
        print(f"- {name}: {source['authors']}, \"{source['title']}\" ({source['year']}), {source['where']}; "
              f"read from {source['read']}")
    print(f"validation: {elapsed:.2f} s (reading the file, calibrating, predicting; target < {TIME_TARGET_S:.0f} s: "
          f"{'met' if elapsed < TIME_TARGET_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
