from __future__ import annotations

from streamkeeper.runtime.pacing import MinPause


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_first_batch_never_waits() -> None:
    clock = FakeClock()
    pause = MinPause(5.0, clock=lambda: clock.now, sleep=clock.sleep)
    assert pause.before_batch() == 0.0
    assert clock.slept == []


def test_waits_out_the_rest_of_the_pause() -> None:
    clock = FakeClock()
    pause = MinPause(5.0, clock=lambda: clock.now, sleep=clock.sleep)
    pause.after_batch()
    clock.now += 2.0
    assert pause.before_batch() == 3.0
    assert clock.slept == [3.0]


def test_no_wait_when_the_pause_already_passed_or_is_zero() -> None:
    clock = FakeClock()
    pause = MinPause(5.0, clock=lambda: clock.now, sleep=clock.sleep)
    pause.after_batch()
    clock.now += 7.0
    assert pause.before_batch() == 0.0
    zero = MinPause(0.0, clock=lambda: clock.now, sleep=clock.sleep)
    zero.after_batch()
    assert zero.before_batch() == 0.0
    assert clock.slept == []
