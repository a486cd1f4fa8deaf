"""The quota queue's one policy (``queue.Scheduler``): the Gittins index on known distributions,
2D-LAS demotion, and the same decisions whoever asks (the simulated queue, the real launcher)."""

from __future__ import annotations

import math

import pytest

from orchestrator.simulate.queue import Job, QueuedRun, Scheduler, schedule

H = 3600.0


def test_gittins_index_on_a_known_distribution() -> None:
    """Three runs of 1 h and one of 10 h (GPU-hours), queues at 1, 2, 4, 8, 16 h. At 0: the
    best stop is the first boundary, P(S <= 1 h) = 3/4 for 1 h of expected service (1 h for
    every run), so 0.75 per GPU-hour; going on to the end gives 1 / 3.25 h, less. Past 1 h only
    the 10 h run is left: index 1/9 per GPU-hour. Falling: a run that got past the first queue
    is a long one."""
    sched = Scheduler("gittins", 4, 1.0, [1 * H, 1 * H, 1 * H, 10 * H])
    assert sched.gittins_index(0.0) == pytest.approx(0.75 / H)
    assert sched.gittins_index(1 * H) == pytest.approx(1 / (9 * H))
    assert sched.gittins_index(10 * H) == 0.0  # past every known length
    # rising: runs all of 10 h; the nearer the end, the likelier it finishes per hour spent
    equal = Scheduler("gittins", 4, 1.0, [10 * H] * 3)
    index = [equal.gittins_index(equal.boundary(k)) for k in range(5)]
    assert index == pytest.approx([1 / (10 * H), 1 / (9 * H), 1 / (8 * H), 1 / (6 * H),
                                   1 / (2 * H)])
    # the maximum over boundaries, not the first one: one run of 0.5 h, three of 1.5 h; stopping
    # at 1 h gives 1/4 for 0.875 h, going on to 2 h (all done) 1 for 1.25 h
    mixed = Scheduler("gittins", 4, 1.0, [0.5 * H, 1.5 * H, 1.5 * H, 1.5 * H])
    assert mixed.gittins_index(0.0) == pytest.approx(1 / (1.25 * H))
    assert 0.25 / (0.875 * H) < 1 / (1.25 * H)


def test_las_demotes_at_every_doubling_and_preempts_for_a_lower_queue() -> None:
    sched = Scheduler("las", 1, 1.0)
    assert [sched.level(a * H) for a in (0, 0.99, 1, 1.99, 2, 4, 8.5)] == [0, 0, 1, 1, 2, 3, 4]
    assert sched.next_boundary(0.5 * H) == 1 * H and sched.next_boundary(3 * H) == 4 * H
    old = Job("old", 1, math.inf, 0, attained=1.2 * H, running=True)
    new = Job("new", 1, math.inf, 1)
    assert sched.running_set([old, new]) == [new]  # old dropped a queue: it yields
    new.attained = 1.5 * H  # same queue now: sweep order
    assert sched.running_set([old, new]) == [old]
    # fifo never preempts: the running run keeps its GPU whatever it received
    fifo = Scheduler("fifo", 1, 1.0)
    assert fifo.running_set([Job("old", 1, 9.0, 1, 9 * H, True), Job("new", 1, 1.0, 0)])[
        0].key == "old"


def test_gittins_keeps_a_run_near_its_end_where_las_preempts_it() -> None:
    """Every run takes 10 GPU-hours: one at 8.5 h is near its end; LAS (it got more) preempts
    it for a fresh run, Gittins (its index is higher) keeps it; in the simulated queue Gittins
    preempts less and finishes runs earlier on average."""
    lengths = [10 * H] * 3
    near = Job("near", 1, math.inf, 0, attained=8.5 * H, running=True)
    fresh = Job("fresh", 1, math.inf, 1)
    assert Scheduler("las", 1, 1.0, lengths).running_set([near, fresh]) == [fresh]
    assert Scheduler("gittins", 1, 1.0, lengths).running_set([near, fresh]) == [near]
    runs = [QueuedRun(str(i), 1, 10 * H, math.inf) for i in range(3)]
    las, gittins = schedule(runs, 1, "las", 1.0), schedule(runs, 1, "gittins", 1.0)
    assert gittins.preemptions < las.preemptions
    assert gittins.average_s < las.average_s
    assert gittins.makespan_s == pytest.approx(las.makespan_s)  # work-conserving both


def test_the_simulated_queue_decides_with_the_scheduler_the_launcher_asks() -> None:
    """The simulation's first preemption is the one the launcher's Scheduler makes from the
    same state: two 1-GPU runs under a quota of 1, 1 h threshold; the first run runs until it
    crosses 1 h, then the second (queue 0) takes the GPU."""
    runs = [QueuedRun("a", 1, 3 * H, math.inf), QueuedRun("b", 1, 0.5 * H, math.inf)]
    simulated = schedule(runs, 1, "las", 1.0)
    assert simulated.completion_s == pytest.approx({"b": 1.5 * H, "a": 3.5 * H})
    assert simulated.preemptions == 1
    sched = Scheduler("las", 1, 1.0)
    a, b = Job("a", 1, math.inf, 0, running=True), Job("b", 1, math.inf, 1)
    a.attained = 1 * H - 1
    assert sched.running_set([a, b]) == [a]
    a.attained = 1 * H
    assert sched.running_set([a, b]) == [b]


def test_nonsense_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="las_threshold_gpu_h"):
        Scheduler("las", 1, 0.0)
