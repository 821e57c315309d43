"""helpers.bench: each status, the JSON schema, and per-rank byte accounting with 2 CPU ranks."""

import dataclasses
import json
import subprocess
import sys

import pytest

from helpers import bench, config, matrix

CPU_FP32 = dict(trainer=False, precision="fp32", pin_memory=False, micro_batch=2)


def spec(stage=2, **kw):
    ds = config.build(stage=stage, world_size=kw.get("world_size", 1), **CPU_FP32)
    return bench.RunSpec(ds_config=ds, shape="tiny", steps=kw.pop("steps", 3), force_cpu=True, **kw)


def test_ok_run_reports_every_field():
    r = bench.measure(spec())
    assert r.status == bench.OK and r.steps_done == 3 and len(r.losses) == 3 and r.losses[-1] < r.losses[0]
    assert r.median_step_s > 0 and r.tokens_per_s > 0 and r.peak_host_rss_bytes > 100 * 2**20
    assert r.n_params == 3_382_080 and r.ranks[0]["params_bytes"] == 4 * r.n_params
    assert json.loads(json.dumps(dataclasses.asdict(r)))["status"] == "ok"
    assert set(dataclasses.asdict(r)) == {f.name for f in dataclasses.fields(bench.RunResult)}


def test_out_of_memory_is_a_status(monkeypatch):
    monkeypatch.setenv(bench.FAKE_OOM_ENV, "1")
    r = bench.measure(spec())
    assert r.status == bench.OOM and "out of memory" in r.message.lower() and r.losses == []


def test_a_run_past_its_ram_budget_is_killed_and_reported():
    r = bench.measure(spec(ram_limit_bytes=50 * 2**20))
    assert r.status == bench.KILLED_RAM and "budget" in r.message


def test_other_errors_carry_their_message():
    bad = spec()
    bad.ds_config["zero_optimization"]["no_such_key"] = 1
    r = bench.measure(bad)
    assert r.status == bench.ERROR and "no_such_key" in r.message


def test_two_cpu_ranks_hold_the_zero_fractions():
    runs = {(stage, n): bench.measure(spec(stage, world_size=n, steps=2)) for stage in (1, 3) for n in (1, 2)}
    assert all(r.status == bench.OK for r in runs.values())
    one, two = runs[(1, 1)].ranks[0], runs[(1, 2)].ranks
    assert [r["optimizer_bytes"] for r in two] == [one["optimizer_bytes"] // 2] * 2
    assert all(r["params_bytes"] == one["params_bytes"] for r in two)
    solo3 = runs[(3, 1)].ranks[0]
    assert all(abs(r["params_bytes"] - solo3["params_bytes"] / 2) <= 0.02 * solo3["params_bytes"] for r in runs[(3, 2)].ranks)


def test_partition_checks_fail_when_bytes_do_not_halve():
    whole = bench.RunResult("x", bench.OK, losses=[1.0], ranks=[{"optimizer_bytes": 8, "grads_bytes": 4, "params_bytes": 4}])
    fake = {(s, n): whole if n == 1 else dataclasses.replace(whole, ranks=[whole.ranks[0]] * 2) for s in range(4) for n in (1, 2)}
    failed = [claim for claim, held in matrix.partition_checks(fake) if not held]
    assert "stage 1: optimizer halved on each of 2 ranks" in failed and "stage 3: params halved on each of 2 ranks" in failed


def test_command_line_prints_the_table():
    done = subprocess.run([sys.executable, "-m", "helpers.bench", "--shape", "tiny", "--stage", "1", "--steps", "2",
                           "--precision", "fp32"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Measured runs" in done.stdout and "stage 1" in done.stdout and " ok " in done.stdout
