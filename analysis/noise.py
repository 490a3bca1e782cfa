"""The noise between launches, and the one test that the verdict, the report and
`dlcompare diff` use to say whether two configurations differ beyond it.

A configuration runs in several separate launches (processes started afresh); the campaign
runs them in rounds, every configuration once per round in a shuffled order
(`launchers.plan.in_rounds`).  Each launch's median iteration time is one sample.  What
differs between launches (placement, clock, page cache, background load) slows every step of a
launch by a share, so the test works on the logarithm of the launch medians, with a fixed
effect per configuration and one per round (the machine's state at the time, shared by every
configuration of that round)::

    log t_cr = b_c + g_r + e_cr,     e_cr ~ N(0, s^2)

fitted by least squares over every launch of the campaign (the round effects from the
deviations of each configuration's launches from its own mean, then each configuration's
effect; numpy).  Two configurations a, b differ by d = b_b - b_a (the log of a's throughput
over b's); their throughput ratio lies in ``exp(d -/+ t(1 - level/2, df) * se(d))`` with the
residual degrees of freedom (launches - configurations - rounds + 1 in a complete campaign) and
Student's t (`scipy.stats.t`).  *Beyond noise*: the interval excludes 1 (two-sided p < level);
*within noise*: it holds 1; *untestable* (None): no degree of freedom is left, as when every
configuration ran once.

Why pooled over the campaign: two launches give one degree of freedom each, and no test of two
launches against two can reach 5 % on its own (a rank test's smallest two-sided p is 0.33
there).  Why rounds: on a shared 2-core VM, whole rounds run faster or slower together (one
campaign here: a 6-round example campaign's one-worker launches 11.7 % CV about their
configuration, 6.4 % once the rounds' common drift is removed).  What it assumes: every
configuration has about the same residual noise (the report prints each one's own spread of
launches, so a user sees where it does not), and a round's drift is the same share for every
configuration.

The in-process repeats of one launch are the *within-launch* spread (their p10-p90): they
measure how steady a launch is, never the difference between schemes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from analysis import tables
from core.schemes import shared_compute

LEVEL = 0.05
# The power at which `launches_to_resolve` and `resolvable_pct` size a campaign.
POWER = 0.8
MAX_LAUNCHES = 64


@dataclass(frozen=True)
class Noise:
    """The fitted between-launch noise of a campaign: the residual standard deviation of log
    launch time (about the coefficient of variation of one launch once the rounds' drift is
    removed), its degrees of freedom, and what `compare` needs of the fit."""

    sd: float
    df: int
    configurations: int
    rounds: int = 0
    effects: dict = field(default_factory=dict)  # configuration -> (b_c, launches, its round weights)
    round_cov: np.ndarray | None = None  # covariance of the fitted round effects
    round_effects: tuple[float, ...] = ()  # g_r, centred within each campaign

    @property
    def known(self) -> bool:
        return self.df > 0 and math.isfinite(self.sd)

    @property
    def cv_pct(self) -> float:
        return 100 * self.sd if self.known else math.nan

    @property
    def drift_pct(self) -> float:
        """How far apart the fastest and slowest rounds ran, in % (the drift the test removes)."""
        if len(self.round_effects) < 2:
            return math.nan
        return 100 * (math.exp(max(self.round_effects) - min(self.round_effects)) - 1)

    def describe(self) -> str:
        """'between-launch CV 3.1 % (6 configurations × 2 rounds, 5 degrees of freedom); the
        rounds drifted 4 % together'."""
        if not self.known:
            return "between-launch noise unknown: no configuration ran in two launches"
        text = (f"between-launch CV {self.cv_pct:.1f} % ({self.configurations} configuration"
                f"{'s' if self.configurations != 1 else ''} × {self.rounds} rounds, {self.df} degree"
                f"{'s' if self.df != 1 else ''} of freedom)")
        return text + (f"; the rounds drifted {self.drift_pct:.0f} % together, which the test removes"
                       if math.isfinite(self.drift_pct) else "")

    def contrast(self, a, b) -> tuple[float, float]:
        """(d, se): the log of configuration a's throughput over b's, and its standard error."""
        (beta_a, n_a, bar_a), (beta_b, n_b, bar_b) = self.effects[a], self.effects[b]
        var = self.sd ** 2 * (1 / n_a + 1 / n_b)
        if self.round_cov is not None and len(bar_a):
            gap = bar_a - bar_b
            var += float(gap @ self.round_cov @ gap)
        return beta_b - beta_a, math.sqrt(var)


UNKNOWN = Noise(math.nan, 0, 0)


def _logs(times: Sequence[float]) -> np.ndarray:
    values = np.asarray([float(t) for t in times], dtype=float)
    return np.log(values[np.isfinite(values) & (values > 0)])


def fit(launches: pd.DataFrame) -> Noise:
    """The noise of a table of launches (columns ``config``, ``round``, ``time``: any hashable
    configuration and round, the launch's median iteration time in seconds; ``campaign`` where
    two campaigns are fitted together), as in the module docstring: round effects from the
    within-configuration deviations, each campaign's centred on zero so that what differs
    between campaigns stays in the configurations' effects, then each configuration's effect.
    `UNKNOWN` where no degree of freedom is left."""
    times = pd.to_numeric(launches["time"], errors="coerce").astype(float)
    data = launches.assign(time=times)[np.isfinite(times) & (times > 0)]
    if data.empty:
        return UNKNOWN
    y = np.log(data["time"].to_numpy(dtype=float))
    config, keys = pd.factorize(data["config"])
    rounds, round_names = pd.factorize(data["round"], sort=True)
    n_configs, n_rounds = len(keys), len(round_names)
    counts = np.bincount(config)
    share = np.zeros((n_configs, n_rounds))  # each configuration's launches per round, as shares
    np.add.at(share, (config, rounds), 1.0)
    share /= counts[:, None]
    # round effects g = M @ gamma: round 1 the reference, then centred within each campaign
    campaign = (pd.factorize(data.groupby(rounds)["campaign"].first().sort_index())[0]
                if "campaign" in data else np.zeros(n_rounds, dtype=int))
    same = (campaign[:, None] == campaign[None, :]).astype(float)
    centre = np.eye(n_rounds) - same / same.sum(axis=1, keepdims=True)
    to_rounds = centre @ np.eye(n_rounds)[:, 1:]
    dummies = np.eye(n_rounds)[rounds][:, 1:]
    y_within = y - (np.bincount(config, y) / counts)[config]
    d_within = dummies - (share[:, 1:])[config]
    gamma = (np.linalg.lstsq(d_within, y_within, rcond=None)[0] if n_rounds > 1 else np.zeros(0))
    rank = np.linalg.matrix_rank(d_within) if n_rounds > 1 else 0
    residual = y_within - d_within @ gamma
    df = len(y) - n_configs - int(rank)
    if df < 1:
        return UNKNOWN
    sd = math.sqrt(float(residual @ residual) / df)
    cov = sd ** 2 * np.linalg.pinv(d_within.T @ d_within) if n_rounds > 1 else None
    weights = share @ to_rounds  # a configuration's mean round effect, as a function of gamma
    beta = np.bincount(config, y) / counts - weights @ gamma
    effects = {key: (float(beta[i]), int(counts[i]), weights[i]) for i, key in enumerate(keys)}
    return Noise(sd, int(df), int((counts >= 2).sum()), int(n_rounds), effects, cov,
                 tuple(float(g) for g in to_rounds @ gamma))


def launch_cv_pct(times: Sequence[float]) -> float:
    """One configuration's own between-launch coefficient of variation (sd of log time), %."""
    logs = _logs(times)
    return 100 * float(logs.std(ddof=1)) if len(logs) >= 2 else math.nan


def _critical(df: int, level: float) -> float:
    return float(stats.t.ppf(1 - level / 2, df))


@dataclass(frozen=True)
class Comparison:
    """a against b: the ratio of their throughputs (>1: a is faster) with its interval."""

    ratio: float
    low: float
    high: float
    p_value: float
    beyond: bool | None  # None: untestable (the noise is unknown)
    launches: tuple[int, int]
    level: float

    @property
    def margin_pct(self) -> float:
        return 100 * (self.ratio - 1)

    def interval_text(self) -> str:
        """'[-4 %, +15 %]' (the interval of the margin), '' where untestable."""
        if self.beyond is None:
            return ""
        return f"[{100 * (self.low - 1):+.0f} %, {100 * (self.high - 1):+.0f} %]"


def interval_factor(launches: int, noise: Noise, level: float = LEVEL) -> float:
    """f such that one configuration's throughput over `launches` launches lies in [x/f, x*f]
    at `level`; NaN where the noise is unknown."""
    if not noise.known or launches < 1:
        return math.nan
    return math.exp(_critical(noise.df, level) * noise.sd / math.sqrt(launches))


def compare(a, b, noise: Noise, level: float = LEVEL, images_ratio: float = 1.0) -> Comparison:
    """Configuration a against b (keys of the fit's configurations): the throughput ratio
    a/b with its interval; beyond noise when that excludes 1.  `images_ratio`: a's images per
    iteration over b's, where they differ (another batch or world size), so that the ratio is
    of throughput, not of iteration time."""
    if not noise.known or a not in noise.effects or b not in noise.effects:
        return Comparison(math.nan, math.nan, math.nan, math.nan, None, (0, 0), level)
    d, se = noise.contrast(a, b)
    d += math.log(images_ratio)
    half = _critical(noise.df, level) * se
    p = 2 * float(stats.t.sf(abs(d) / se, noise.df)) if se > 0 else (0.0 if d else 1.0)
    return Comparison(math.exp(d), math.exp(d - half), math.exp(d + half), p, bool(p < level),
                      (noise.effects[a][1], noise.effects[b][1]), level)


def _needed_half_width(sd: float, df: int, launches: int, level: float, power: float) -> float:
    """Log margin a campaign of `launches` each resolves with `power` (two-sided `level`)."""
    return (_critical(df, level) + float(stats.t.ppf(power, df))) * sd * math.sqrt(2 / launches)


def resolvable_pct(noise: Noise, launches: int, configurations: int, level: float = LEVEL,
                   power: float = POWER) -> float:
    """The smallest difference (%) that `launches` launches of each of `configurations`
    configurations show beyond noise with probability `power`, at the measured noise."""
    df = (configurations - 1) * (launches - 1)  # a complete campaign: every configuration each round
    if not noise.known or df < 1:
        return math.nan
    return 100 * (math.exp(_needed_half_width(noise.sd, df, launches, level, power)) - 1)


def launches_to_resolve(margin_pct: float, noise: Noise, configurations: int, level: float = LEVEL,
                        power: float = POWER) -> int | None:
    """The fewest launches per configuration at which a true difference of `margin_pct` shows
    beyond noise with probability `power`; None when unknown or beyond `MAX_LAUNCHES`."""
    if not noise.known or not margin_pct or not math.isfinite(margin_pct):
        return None
    target = abs(math.log1p(margin_pct / 100))
    for launches in range(2, MAX_LAUNCHES + 1):
        df = max(1, (configurations - 1) * (launches - 1))
        if _needed_half_width(noise.sd, df, launches, level, power) <= target:
            return launches
    return None


# --------------------------------------------------------------------------- from the runs frame

def launch_times(frame: pd.DataFrame, keys: list[str] | None = None) -> pd.DataFrame:
    """One row per configuration (`keys`, by default `tables.CONFIG_KEYS`) of the successful
    runs: ``launch_times``, its launches' median iteration times in seconds, launch order."""
    keys = keys or tables.CONFIG_KEYS
    ok = tables.ok_runs(tables.prepare(frame))
    ok = ok[pd.to_numeric(ok["iter_time_median"], errors="coerce") > 0]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "launch_times"])
    launch = pd.to_numeric(ok["extra_launch"], errors="coerce").fillna(1) if "extra_launch" in ok else 1
    ok = ok.assign(_launch=launch).sort_values("_launch", kind="stable")
    return (ok.groupby(keys, dropna=False, sort=True)["iter_time_median"]
            .agg(lambda times: [float(t) for t in times]).rename("launch_times").reset_index())


def config_key(row, keys: list[str] | None = None) -> str:
    """A configuration's key in the fit: its `keys` (`tables.CONFIG_KEYS`) values, as text."""
    return "|".join(str(row[k]) for k in keys or tables.CONFIG_KEYS)


def launch_rows(frame: pd.DataFrame, campaign: str = "", keys: list[str] | None = None) -> pd.DataFrame:
    """The successful launches of a runs frame as `fit` takes them: ``config`` (`config_key`
    of `keys`, by default `tables.CONFIG_KEYS`, prefixed by `campaign`), ``round`` (the launch
    number, prefixed the same way), ``campaign`` and ``time``."""
    ok = tables.ok_runs(tables.prepare(frame))
    if ok.empty:
        return pd.DataFrame(columns=["config", "round", "campaign", "time"])
    launch = (pd.to_numeric(ok["extra_launch"], errors="coerce").fillna(1).astype(int)
              if "extra_launch" in ok else pd.Series(1, index=ok.index))
    keys = keys or tables.CONFIG_KEYS
    return pd.DataFrame({"config": [campaign + config_key(r, keys) for r in ok[keys].to_dict("records")],
                         "round": [f"{campaign}{k:04d}" for k in launch], "campaign": campaign,
                         "time": pd.to_numeric(ok["iter_time_median"], errors="coerce").to_numpy(dtype=float)})


def campaign_noise(frame: pd.DataFrame) -> Noise:
    """The between-launch noise of one campaign's runs frame (`fit` of its `launch_rows`)."""
    return fit(launch_rows(frame))


NOISE_COLUMNS: list[str] = ["scheme", "model", "topology", "batch_per_worker", "links", "launches", "launch_ms",
                            "launch_cv_pct"]


def noise_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: its launches' median iteration times (ms, launch order) and its own
    between-launch CV, so that a configuration noisier than the campaign's pooled noise shows."""
    found = launch_times(frame)
    if found.empty:
        return pd.DataFrame(columns=NOISE_COLUMNS)
    return pd.DataFrame({
        "scheme": [f"{f}:{m}" for f, m in zip(found["framework"], found["mode"])], "model": found["model"],
        "topology": [tables.topology_short(n, w) for n, w in zip(found["nodes"], found["workers_per_node"])],
        "batch_per_worker": found["batch_per_worker"],
        "links": [tables.links_text(b, lat) for b, lat in zip(found["bandwidth"], found["latency"])],
        "launches": [len(t) for t in found["launch_times"]],
        "launch_ms": [" ".join(f"{1e3 * x:.1f}" for x in t) for t in found["launch_times"]],
        "launch_cv_pct": [launch_cv_pct(t) for t in found["launch_times"]]})[NOISE_COLUMNS]


def shared_computation(frame: pd.DataFrame, fitted: Noise) -> list[dict]:
    """The A/A controls a campaign gets for free: one-worker configurations of schemes that run
    the same computation with one worker (`core.schemes.shared_compute`), fastest against
    slowest at the level divided by the pairs there are to choose from.  A control beyond noise says the pooled noise understates what differs between
    launches (or that the schemes' one-worker steps are not the same after all)."""
    found = launch_times(frame)
    single = found[pd.to_numeric(found["world_size"], errors="coerce") == 1]
    controls = []
    if single.empty:
        return controls
    keys = [config_key(r) for r in single.to_dict("records")]
    # fastest and slowest by the fitted effect (rounds' drift removed), by the median without a fit
    single = single.assign(compute=[shared_compute(f, m) for f, m in zip(single["framework"], single["mode"])],
                           median=[fitted.effects[k][0] if k in fitted.effects else float(np.log(np.median(t)))
                                   for k, t in zip(keys, single["launch_times"])])
    for _, group in single.groupby(["model", "device", "batch_per_worker", "compute"], dropna=False, sort=True):
        if len(group) < 2:
            continue
        fast, slow = group.loc[group["median"].idxmin()], group.loc[group["median"].idxmax()]
        # fastest against slowest is the largest of k(k-1)/2 pairs: Bonferroni's level for it
        result = compare(config_key(fast), config_key(slow), fitted, LEVEL / math.comb(len(group), 2))
        names = ", ".join(tables.series_name(l, m) for l, m in zip(group["framework_label"], group["mode"]))
        verdict = {True: "beyond noise: the pooled noise understates the difference between launches, or these "
                         "one-worker steps are not the same",
                   False: "within noise, as it should be", None: "untestable with one launch each"}[result.beyond]
        controls.append({"beyond": result.beyond, "text": (
            f"{group.iloc[0]['model']} at one worker, batch {int(group.iloc[0]['batch_per_worker'])}: {names} run one "
            f"computation; fastest against slowest {result.margin_pct:+.1f}% {result.interval_text()}: {verdict}")})
    return controls
