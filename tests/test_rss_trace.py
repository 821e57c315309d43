"""helpers.runner's PhaseTrace: a transient lands in the phase that made it, and only there."""

from helpers import runner


# A fresh process (no earlier test's threads or heap): its kernel high-water mark is first raised
# past the spike, so only the sampling thread can see the spike. Prints the phases' rises in MB and
# how many samples the thread took while the block was held.
SAMPLED = r"""
import json, time
from helpers import runner
MB = 2**20
high = bytearray(b"\x01") * (400 * MB)  # the kernel's high-water mark now sits above the spike
del high
trace = runner.PhaseTrace(interval_s=0.005)
trace.enter("before")
time.sleep(0.05)
trace.enter("spike")
block = bytearray(b"\x01") * (200 * MB)  # written, so resident
# held until the thread has sampled a few times (on a loaded machine 50 ms may hold none)
taken, deadline = trace.samples, time.monotonic() + 120
while trace.samples < taken + 3 and time.monotonic() < deadline:
    time.sleep(0.01)
held = trace.samples - taken
del block
trace.enter("after")
time.sleep(0.05)
phases = trace.stop()
print("RESULT", json.dumps({"held_samples": held, "order": [p["name"] for p in phases],
      "rise": {p["name"]: (p["peak_bytes"] - p["start_bytes"]) // MB for p in phases},
      "peak": {p["name"]: p["peak_bytes"] // MB for p in phases}}))
"""


def _run_fresh(script: str) -> dict:
    """Runs ``script`` in a fresh Python at the repository root; the JSON after its RESULT line."""
    import json
    import subprocess
    import sys

    from helpers import env

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=str(env.REPO_ROOT))
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(line[len("RESULT "):])


def test_a_transient_shows_in_its_phase_and_not_in_the_others():
    got = _run_fresh(SAMPLED)
    assert got["held_samples"] >= 3, f"the sampling thread never ran while the block was held: {got}"
    assert got["order"] == ["before", "spike", "after"], got
    rise = got["rise"]
    assert rise["spike"] > 180, got
    assert rise["before"] < 50 and rise["after"] < 50, got
    assert got["peak"]["after"] < got["peak"]["spike"] - 150, got


def test_a_phase_entered_again_keeps_one_peak_and_counts_its_entries():
    trace = runner.PhaseTrace(interval_s=0.005)
    for _ in range(3):
        trace.enter("forward and backward")
        trace.enter("optimizer step")
    phases = trace.stop()
    assert [(p["name"], p["entries"]) for p in phases] == [("forward and backward", 3), ("optimizer step", 3)]


# A fresh process: a spike 300 MB past its high so far in a phase the sampler never samples
# (a 60 s interval), freed before the phase ends. Prints {phase: rise in MB}.
UNSAMPLED = r"""
import json, psutil
from helpers import runner
trace = runner.PhaseTrace(interval_s=60)
trace.enter("calm")
# past the process's high so far (imports may have peaked above what stays resident)
need = runner.high_water_bytes() - psutil.Process().memory_info().rss + 300 * 2**20
trace.enter("spike")
block = bytearray(b"\x01") * need
del block
trace.enter("after")
print("RESULT", json.dumps({p["name"]: (p["peak_bytes"] - p["start_bytes"]) // 2**20 for p in trace.stop()}))
"""


def test_a_spike_the_sampler_missed_is_caught_by_the_kernels_high_water_mark():
    rise = _run_fresh(UNSAMPLED)
    assert rise["spike"] >= 280, rise
    assert rise["calm"] < 50 and rise["after"] < 50, rise


def fake_cuda(monkeypatch, allocated: dict, reserved_extra: int = 0) -> None:
    """torch.cuda's peak counters as a dict: ``now`` allocated, ``peak`` since the last reset."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: allocated["peak"] + reserved_extra)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda: allocated.update(peak=allocated["now"]))


def test_each_phase_keeps_its_own_gpu_peak_and_the_run_keeps_the_largest(monkeypatch):
    """torch's GPU peak counter is read and reset at each switch: a phase's peak is its own (a
    trace that never reset would give every later phase the first one's), the largest is kept."""
    allocated = {"now": 0, "peak": 0}

    def grow(nbytes):
        allocated["now"] += nbytes
        allocated["peak"] = max(allocated["peak"], allocated["now"])

    fake_cuda(monkeypatch, allocated, reserved_extra=1)
    trace = runner.PhaseTrace()
    trace.enter("deepspeed.initialize")
    grow(3_000)
    grow(-2_500)  # the whole model on the device, then partitioned
    trace.enter("forward and backward")
    grow(1_000)
    grow(-1_000)
    phases = {p["name"]: p["gpu_peak_bytes"] for p in trace.stop()}
    assert phases == {"deepspeed.initialize": 3_000, "forward and backward": 1_500}
    assert trace.gpu_high == 3_000 and trace.gpu_reserved_high == 3_001


def test_the_fine_tunes_watch_reports_the_whole_runs_gpu_peak(monkeypatch):
    """Notebook 06's fine-tune reads its GPU peak through a trace: the peak of the whole run, not
    what came after the trace's last reset (a watch that read torch's counter after stop() gave
    the GPU run 2.15 GiB for a 3.08 GiB fine-tune)."""
    from helpers.lessons import biggest_model

    allocated = {"now": 0, "peak": 0}
    fake_cuda(monkeypatch, allocated)
    watch = biggest_model.Watch()
    allocated.update(now=500, peak=3_000)  # the fine-tune's steps peaked at 3,000 bytes
    run = watch.stop(1.0, [2.0, 1.0], [0.5, 0.5], 0, 64)
    assert run.peak_gpu_allocated_bytes == 3_000


def test_a_peak_from_before_the_watch_is_not_the_fine_tunes(monkeypatch):
    """A kernel that peaked before the fine-tune (a cell run again, an earlier model) must not
    lend that peak to it."""
    from helpers.lessons import biggest_model

    allocated = {"now": 0, "peak": 9_000}  # an earlier cell's peak, still in torch's counter
    fake_cuda(monkeypatch, allocated)
    watch = biggest_model.Watch()
    allocated.update(now=500, peak=3_000)
    assert watch.stop(1.0, [2.0, 1.0], [0.5, 0.5], 0, 64).peak_gpu_allocated_bytes == 3_000


def test_without_cuda_no_phase_has_a_gpu_peak(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trace = runner.PhaseTrace()
    trace.enter("only")
    assert [p["gpu_peak_bytes"] for p in trace.stop()] == [None] and trace.gpu_high == 0
