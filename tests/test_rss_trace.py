"""helpers.rss_trace: a transient lands in the phase that made it, and only there."""

import time

from helpers import rss_trace

MB = 2**20


def test_a_transient_shows_in_its_phase_and_not_in_the_others():
    trace = rss_trace.PhaseTrace(interval_s=0.005)
    trace.enter("before")
    time.sleep(0.05)
    trace.enter("spike")
    block = b"\x01" * (200 * MB)  # written, so resident
    time.sleep(0.05)
    del block
    trace.enter("after")
    time.sleep(0.05)
    phases = {p["name"]: p for p in trace.stop()}
    assert list(phases) == ["before", "spike", "after"]
    rise = lambda name: phases[name]["peak_bytes"] - phases[name]["start_bytes"]
    assert rise("spike") > 180 * MB
    assert rise("before") < 50 * MB and rise("after") < 50 * MB
    assert phases["after"]["peak_bytes"] < phases["spike"]["peak_bytes"] - 150 * MB


def test_a_phase_entered_again_keeps_one_peak_and_counts_its_entries():
    trace = rss_trace.PhaseTrace(interval_s=0.005)
    for _ in range(3):
        trace.enter("forward and backward")
        trace.enter("optimizer step")
    phases = trace.stop()
    assert [(p["name"], p["entries"]) for p in phases] == [("forward and backward", 3), ("optimizer step", 3)]
