"""Benchmark: the model against published multi-node measurements (validation/published.toml).

    python -m bench.published_validation [--file validation/published.toml]

For every published case (source, cluster, network, scheme, batch, nodes x workers per node):
the published weak-scaling efficiency beside the model's prediction on the described
cluster's hierarchy (`analysis.published`), the error in points of efficiency, the
bottleneck the model names, and the flat model's prediction (every rank on one link of the
NIC's speed, no software cost) with its error.  Then the median |error| of both and the
sources with their citations.  Parameters come from spec sheets and the sources'
descriptions; nothing is fitted to the published answers.  Runs in the launcher's
environment (re-executes itself there).
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.cli import OneLineParser, fail
from core.envs import REPO_ROOT, reexec_in_host_env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="python -m bench.published_validation")
    parser.add_argument("--file", default=str(REPO_ROOT / "validation" / "published.toml"))
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.published_validation", argv)
    import pandas as pd  # after the re-exec: the launcher's environment has pandas

    from analysis import published, rendering

    try:
        sources, _ = published.load_cases(Path(args.file))
    except (published.PublishedError, ValueError) as error:
        return fail(error)
    rows = published.validation_rows(Path(args.file))
    table = pd.DataFrame(rows)
    print(rendering.to_markdown(table.round({"published": 3, "predicted": 3, "flat": 3, "device_efficiency": 3,
                                          "error_points": 1, "flat_error_points": 1})))
    print(f"median |error|: hierarchical model {published.median_abs_points(rows, 'error_points'):.1f} points, "
          f"flat model {published.median_abs_points(rows, 'flat_error_points'):.1f} points of efficiency "
          f"({len(rows)} published points, {len(sources)} sources)")
    for name, source in sources.items():
        print(f"- {name}: {source['authors']}, \"{source['title']}\" ({source['year']}), {source['where']}; "
              f"read from {source['read']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
