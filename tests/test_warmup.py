"""The steady-state warm-up (adapters/worker.py `warm_up`) on trainers whose step time is known:
it goes on while the step time falls, stops once it does not, stops at its cap, and keeps the
fixed count where the ranks cannot decide together; and the binding of a rank to cores of its own."""

from __future__ import annotations

import time

from adapters.base import RunConfig
from adapters.worker import WARMUP_WINDOWS_CAP, Progress, warm_up


class TimedTrainer:
    """Steps that sleep a given time each: `times(k)` seconds for step k."""

    def __init__(self, times, agrees: bool = True):
        self.times, self.agrees, self.steps = times, agrees, 0

    def step(self):
        time.sleep(self.times(self.steps))
        self.steps += 1

    def sync(self):
        pass

    def any_rank(self, flag):
        return flag if self.agrees else None


CONFIG = RunConfig(run_id="w", framework="torch", mode="ddp", model="alexnet-tiny", batch_per_worker=1,
                   warmup=2, iterations=4)


def warmed(trainer) -> dict:
    return warm_up(trainer, CONFIG, 0, Progress("", 1, 0))


def test_warm_up_goes_on_while_the_step_time_falls():
    # 40 ms falling to 10 ms over the first 10 steps, then flat; windows of 2 steps after the fixed 2:
    # steps 10-11 are still faster than 8-9, steps 12-13 are not faster than 10-11
    found = warmed(TimedTrainer(lambda k: 0.010 + 0.030 * max(0.0, 1 - k / 10)))
    assert found == {"warmup_steps": 14, "warmup_steady": True}


def test_a_steady_trainer_stops_after_two_windows():
    found = warmed(TimedTrainer(lambda k: 0.010))
    assert found == {"warmup_steps": 2 + 2 + 2, "warmup_steady": True}  # the first window has none to beat


def test_a_time_that_keeps_falling_stops_at_the_cap():
    found = warmed(TimedTrainer(lambda k: 0.050 * 0.8 ** (k // 2)))
    assert found == {"warmup_steps": 2 + 2 * WARMUP_WINDOWS_CAP, "warmup_steady": False}


def test_ranks_that_cannot_decide_together_keep_the_fixed_count():
    found = warmed(TimedTrainer(lambda k: 0.010 + 0.030 * max(0.0, 1 - k / 10), agrees=False))
    assert found == {"warmup_steps": 2, "warmup_steady": None}


def test_binding_gives_each_rank_cores_of_its_own_and_only_when_asked():
    import os

    from adapters.worker import bind_to_cores

    allowed = os.sched_getaffinity(0)
    try:
        assert bind_to_cores(CONFIG, 1) is None and os.sched_getaffinity(0) == allowed
        config = RunConfig(run_id="b", framework="torch", mode="ddp", model="alexnet-tiny", batch_per_worker=1,
                           threads_per_worker=1, options={"bind_cores": True})
        cores = sorted(allowed)
        mine = []
        for rank in range(len(cores)):  # each rank is a process of its own: it starts from every core
            os.sched_setaffinity(0, allowed)
            mine.append(bind_to_cores(config, rank))
            assert os.sched_getaffinity(0) == set(mine[-1])
        assert mine == [[core] for core in cores]  # one core each, none shared
    finally:
        os.sched_setaffinity(0, allowed)
