"""The between-launch test (analysis/noise.py): the fit against the textbook two-way analysis
by hand, an unbalanced campaign against a full least-squares fit, and its error rates on
synthetic campaigns at the noise measured on a 2-core VM."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import noise

# The example campaign's residual between-launch CV on a 2-core EPYC VM (2026-12-07, 6 rounds:
# bench/launch_noise.py) and how far its rounds drifted together.
MEASURED_CV = 0.071
ROUND_DRIFT = 0.06


def launches(times: dict[str, list[float]]) -> pd.DataFrame:
    """Launch k of each configuration in round k."""
    return pd.DataFrame([{"config": c, "round": k, "time": t} for c, ts in times.items()
                         for k, t in enumerate(ts, start=1)])


def test_a_complete_campaign_fits_as_the_textbook_two_way_analysis():
    times = {"a": [0.100, 0.104, 0.099], "b": [0.110, 0.118, 0.111], "c": [0.120, 0.121, 0.119]}
    y = np.log(np.array(list(times.values())))
    residual = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    sd = math.sqrt((residual ** 2).sum() / ((3 - 1) * (3 - 1)))
    fitted = noise.fit(launches(times))
    assert (fitted.df, fitted.configurations, fitted.rounds) == (4, 3, 3)
    assert fitted.sd == pytest.approx(sd)
    found = noise.compare("a", "b", fitted)
    d = y[1].mean() - y[0].mean()  # a's throughput over b's, in logs
    half = stats.t.ppf(0.975, 4) * sd * math.sqrt(2 / 3)
    assert (found.ratio, found.low, found.high) == pytest.approx((math.exp(d), math.exp(d - half), math.exp(d + half)))
    assert found.p_value == pytest.approx(2 * stats.t.sf(d / (sd * math.sqrt(2 / 3)), 4))


def test_an_unbalanced_campaign_matches_a_full_least_squares_fit():
    rng = np.random.default_rng(3)
    rows = [{"config": c, "round": r, "time": 0.1 * (1 + 0.1 * i) * math.exp(0.05 * r + 0.03 * rng.standard_normal())}
            for i, c in enumerate("abcd") for r in range(1, 5) if not (c == "d" and r > 2)]  # d: two rounds only
    data = pd.DataFrame(rows)
    fitted = noise.fit(data)
    design = np.hstack([pd.get_dummies(data["config"]).to_numpy(float),
                        pd.get_dummies(data["round"]).to_numpy(float)[:, 1:]])
    y = np.log(data["time"].to_numpy())
    beta, rss, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    df = len(y) - rank
    assert fitted.df == df and fitted.sd == pytest.approx(math.sqrt(rss[0] / df))
    cov = fitted.sd ** 2 * np.linalg.inv(design.T @ design)
    contrast = np.zeros(design.shape[1])
    contrast[[0, 3]] = [1, -1]  # a against d
    d, se = fitted.contrast("d", "a")  # log of d's throughput over a's: a's log time less d's
    assert d == pytest.approx(beta[0] - beta[3]) and se == pytest.approx(math.sqrt(contrast @ cov @ contrast))


def test_one_launch_each_leaves_the_noise_unknown():
    fitted = noise.fit(launches({"a": [0.1], "b": [0.2]}))
    assert not fitted.known and noise.compare("a", "b", fitted).beyond is None


def synthetic_campaign(rng, schemes: int, launches_each: int, shift: float = 0.0) -> pd.DataFrame:
    """An example-campaign-shaped draw: `schemes` at 1 and 2 workers, every configuration once per
    round; rounds drift together; scheme 0 at 2 workers is `shift` faster."""
    rows = []
    drift = ROUND_DRIFT * rng.standard_normal(launches_each)
    for world in (1, 2):
        for scheme in range(schemes):
            base = math.log(0.02 * world) - (shift if (scheme == 0 and world == 2) else 0.0)
            for k in range(launches_each):
                rows.append({"config": f"{scheme}-{world}", "round": k, "time": math.exp(
                    base + drift[k] + MEASURED_CV * rng.standard_normal())})
    return pd.DataFrame(rows)


def clear_wins(rng, schemes: int, launches_each: int, draws: int, shift: float = 0.0) -> float:
    """The share of draws in which scheme 0 against scheme 1 at 2 workers is called beyond noise."""
    calls = 0
    for _ in range(draws):
        fitted = noise.fit(synthetic_campaign(rng, schemes, launches_each, shift))
        calls += noise.compare("0-2", "1-2", fitted).beyond is True
    return calls / draws


def test_two_identical_schemes_are_called_apart_about_as_often_as_the_level_says():
    """An exact t-test errs at its level: 5 % of 1,000 draws is 50 ± 7 (one binomial standard
    error), so the bound leaves three; a test that read within-launch repeats or ignored the
    rounds' drift would err far more often (see the next test)."""
    rate = clear_wins(np.random.default_rng(11), schemes=2, launches_each=2, draws=1000)
    print(f"identical schemes called apart in {100 * rate:.1f} % of 1,000 draws")
    assert rate <= noise.LEVEL + 3 * math.sqrt(noise.LEVEL * (1 - noise.LEVEL) / 1000)
    assert rate >= 0.02  # and not so timid that it could never call a win


def test_the_within_launch_rule_would_fail_that_bound():
    """A rule that reads the within-launch spread (a win is clear where the p10-p90 of the two
    schemes' in-process repeats do not overlap) on the same kind of draws, one launch each with
    3 repeats 2 % apart: it calls identical schemes apart far above the level."""
    rng = np.random.default_rng(5)
    calls = 0
    for _ in range(1000):
        launch = np.exp(MEASURED_CV * rng.standard_normal(2))  # two launches of one computation
        repeats = launch[:, None] * (1 + 0.02 * rng.standard_normal((2, 3)))
        fast, slow = sorted(repeats, key=np.median)
        calls += np.percentile(fast, 90) < np.percentile(slow, 10)
    assert calls / 1000 > 0.3


def test_power_for_a_ten_percent_difference_at_the_default_launches_is_stated():
    """At 2 launches each (the default) and 7 % CV the test rarely resolves 10 %; the analytic
    sizing in `launches_to_resolve` says how many launches would, and the simulation agrees."""
    rng = np.random.default_rng(2)
    power_default = clear_wins(rng, schemes=3, launches_each=2, draws=400, shift=math.log(1.1))
    fitted = noise.Noise(MEASURED_CV, 10, 6)
    needed = noise.launches_to_resolve(10, fitted, configurations=6)
    power_needed = clear_wins(rng, schemes=3, launches_each=needed, draws=200, shift=math.log(1.1))
    print(f"power for 10 % at 2 launches: {power_default:.2f}; {needed} launches: {power_needed:.2f}")
    assert power_default < 0.5 <= power_needed, (power_default, needed, power_needed)
    assert power_needed == pytest.approx(noise.POWER, abs=0.12)
