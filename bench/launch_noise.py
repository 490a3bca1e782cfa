"""Benchmark: the noise between launches on this machine, and what the launches cost.

    python -m bench.launch_noise [--launches 6] [--out results/bench-launch-noise]

Runs the README's example campaign (`examples/campaign.yaml`: three schemes on the same PyTorch
compute, one and two workers) twice, with each rank's threads bound to cores of their own
(``--option bind_cores=true``) and without, `--launches` launches of each configuration in
shuffled rounds, the two campaigns a round at a time in turn (resuming each with one launch
more) so that the machine's drift falls on both alike.  For each it reads the store and reports:

- the residual between-launch CV of the verdict's test (`analysis.noise.fit`: one effect per
  configuration, one per round) and how far the rounds drifted together;
- each configuration's own CV of its launch medians, and the A/A control (the schemes that
  share one one-worker computation);
- the smallest difference two schemes' launches resolve at 80 % power, for 2 launches each (the
  default) up to `--launches`, at the measured noise;
- the wall time per launch, so the default's cost can be read: L launches cost L times one.

Binding stays off by default unless it lowers the between-launch CV here.  A resumed `--out`
keeps its launches (delete the folder for a fresh measurement).  Writes ``launch_noise.json``
under `--out`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from core.envs import REPO_ROOT, reexec_in_host_env

if __name__ == "__main__":  # pandas, scipy: the launcher's environment
    reexec_in_host_env("bench.launch_noise", sys.argv[1:])

from analysis import noise  # noqa: E402
from analysis.store import ResultStore  # noqa: E402

EXAMPLE = REPO_ROOT / "examples" / "campaign.yaml"


BINDINGS = {"unbound": [], "bound": ["--option", "bind_cores=true"]}


def run_example(out: Path, launches: int, extra: list[str]) -> float:
    """The example campaign with `launches` launches into `out`; its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "launchers.compare", str(EXAMPLE), "--launches", str(launches),
                           "--out", str(out), *extra], cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"bench.launch_noise: the example campaign exited {done.returncode}")
    return time.perf_counter() - started


def report(out: Path, launches: int, wall_s: float) -> dict:
    """What the store says of its noise (see the module docstring), printed and returned."""
    with ResultStore.for_campaign(out, create=False, read_only=True) as store:
        frame = store.campaign_frame()
        durations = [r["duration_s"] for r in store.records() if r.get("duration_s")]
    fitted = noise.campaign_noise(frame)
    per_config = noise.noise_table(frame)
    configurations = len(per_config)
    resolvable = {k: noise.resolvable_pct(fitted, k, configurations) for k in range(2, max(2, launches) + 1)}
    controls = [c["text"] for c in noise.shared_computation(frame, fitted)]
    print(fitted.describe())
    print(per_config.to_string(index=False))
    for line in controls:
        print("A/A control:", line)
    for k, pct in resolvable.items():
        print(f"{k} launches each resolve {pct:.0f}% (80% power, level {noise.LEVEL:g})")
    per_launch = sum(durations) / len(durations) if durations else float("nan")
    print(f"{len(durations)} launches, {per_launch:.1f} s each on average; the campaign took {wall_s:.0f} s "
          "with its reports")
    return {"cv_pct": fitted.cv_pct, "df": fitted.df, "drift_pct": fitted.drift_pct,
            "configurations": per_config.to_dict("records"), "aa_controls": controls,
            "resolvable_pct": resolvable, "launch_s": per_launch, "campaign_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.launch_noise", description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=6, help="launches of each configuration (default 6)")
    parser.add_argument("--out", default="results/bench-launch-noise", help="the campaign folder")
    args = parser.parse_args(argv)
    if args.launches < 2:
        parser.error("--launches must be at least 2: one launch measures no noise between launches")
    out = Path(args.out).resolve()
    wall_s = dict.fromkeys(BINDINGS, 0.0)
    for launches in range(1, args.launches + 1):  # a round of each campaign in turn
        for name, extra in BINDINGS.items():
            wall_s[name] += run_example(out / name, launches, extra)
    found = {}
    for name in BINDINGS:
        print(f"== {name}")
        found[name] = report(out / name, args.launches, wall_s[name])
    (out / "launch_noise.json").write_text(json.dumps(found, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
