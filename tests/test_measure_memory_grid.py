"""tools/measure_memory_grid.py: the grid's shape and split, a real tiny run on the CPU,
refusals."""

import json

import pytest

from helpers import config, measurements, memory
from helpers import env as kit_env
from tools import measure_memory_grid as grid_tool


def test_the_grid_covers_the_issue_and_half_of_it_is_held_out():
    t4 = config.t4_profile(kit_env.describe())
    planned = grid_tool.plan(t4, smoke=False, steps=3, nvme=True)
    cases = [p[0] for p in planned]
    assert len(cases) >= 45 and sum(p[1] == "validation" for p in planned) >= 20
    assert {c.row for c in cases} == {label for label, _ in grid_tool.config.STAGE_ROWS}
    assert {c.grad_ckpt for c in cases} == {True, False}
    assert min(c.micro_batch for c in cases) == 1 and max(c.micro_batch for c in cases) == 16
    assert min(c.seq_len for c in cases) == 256 and max(c.seq_len for c in cases) == 2048
    assert any(s.startswith("gpt2-1.5b") for s in {c.shape for c in cases}) and any(
        "llama" in c.shape for c in cases
    )
    words = [grid_tool._verdicts(p[3], t4)["gpu"] for p in planned]
    assert (
        words.count(memory.NO_FIT) >= 5 and words.count(memory.TIGHT) >= 2
    )  # cases at and past the cap
    assert len({c.id for c in cases}) == len(cases)
    assert sum(p[4] for p in planned) / 60 / 4 < 8  # minutes of wall time with 4 side by side


def test_the_held_out_cases_are_none_of_the_grids_and_all_validation():
    t4 = config.t4_profile(kit_env.describe())
    held = grid_tool.plan(t4, smoke=False, steps=3, nvme=True, held_out=True)
    grid_ids = {c.id for c, _ in grid_tool.grid()}
    assert held and all(p[1] == "validation" and p[0].id not in grid_ids for p in held)
    assert {p[0].row for p in held} >= {"stage 3 + CPU offload", "stage 3 + NVMe offload"}
    without_nvme = grid_tool.plan(t4, smoke=False, steps=3, nvme=False, held_out=True)
    assert all(p[0].row != "stage 3 + NVMe offload" for p in without_nvme)


def test_a_smoke_case_runs_and_its_row_loads_as_a_measurement(tmp_path, capsys):
    out = tmp_path / "grid.jsonl"
    assert grid_tool.main(["--smoke", "--max-cases", "1", "--steps", "2", "--out", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "ok" and row["split"] == "fit" and row["steps_done"] == 2
    assert row["machine"].startswith("measured on") and row["predicted_cpu_bytes"] > 0
    assert row["peak_host_rss_bytes"] > 0 and row["verdicts"]["cpu"] in (
        memory.FITS,
        memory.TIGHT,
    )
    (loaded,) = measurements.load(out)
    assert measurements.predict(loaded).estimate.total("cpu") > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--out", "/no/such/folder/x.jsonl", "--smoke"],
            "--out '/no/such/folder/x.jsonl': its folder does not exist",
        ),
        (["--smoke"], "--out '': give a file"),
        (
            ["--smoke", "--out", "x.jsonl", "--limit-minutes", "0"],
            "--limit-minutes 0: must be a number of minutes > 0",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as done:
        grid_tool.main(argv)
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and err.startswith(f"measure_memory_grid: {message}"), err


def test_the_full_grid_without_a_gpu_is_refused(tmp_path, capsys, monkeypatch):
    cpu = kit_env.describe()
    if cpu.has_gpu:  # on a GPU machine, pretend to have none
        cpu = cpu.__class__(**{**cpu.__dict__, "gpu_name": None})
    monkeypatch.setattr(grid_tool.env, "describe", lambda *a, **k: cpu)
    with pytest.raises(SystemExit) as done:
        grid_tool.main(["--out", str(tmp_path / "x.jsonl")])
    assert done.value.code == 2 and "no GPU here" in capsys.readouterr().err


def test_merge_adds_grid_rows_and_refuses_a_file_that_is_not_rows(tmp_path, capsys):
    store = tmp_path / "measurements.json"
    store.write_text(json.dumps({"about": "x", "rows": [{"id": "a", "status": "ok"}]}))
    lines = tmp_path / "grid.jsonl"
    row = {"id": "b", "shape": "tiny", "row": "stage 0", "status": "ok", "split": "validation"}
    tried = {**row, "status": "not tried"}
    never = {**tried, "id": "n"}  # a case the grid never ran: nothing measured, not merged
    lines.write_text(
        "".join(json.dumps(r) + "\n" for r in (tried, row, {**row, "id": "a"}, never))
    )
    assert grid_tool.merge(measurements.load(lines), store) == 2
    merged = json.loads(store.read_text())["rows"]
    assert [(r["id"], r["status"]) for r in merged] == [("b", "ok"), ("a", "ok")]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "c"}) + "\n")
    with pytest.raises(SystemExit) as done:
        grid_tool.main(["--merge", str(tmp_path / "bad.jsonl")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "lacks id, shape, row, status or split" in err


def test_a_second_call_resumes_with_the_cases_not_recorded_yet(tmp_path):
    out = tmp_path / "grid.jsonl"
    first = {"id": grid_tool.grid(smoke=True)[0][0].id, "status": "ok"}
    later = {"id": grid_tool.grid(smoke=True)[1][0].id, "status": "not tried"}
    out.write_text(json.dumps(first) + "\n" + json.dumps(later) + "\n")
    assert grid_tool.finished_ids(out) == {first["id"]}
    assert grid_tool.finished_ids(tmp_path / "none.jsonl") == set()


def test_redo_first_step_runs_again_only_the_cases_whose_latest_run_was_first_step(tmp_path):
    out = tmp_path / "grid.jsonl"
    base = {"shape": "smollm2-360m-shaped", "row": "stage 2", "status": "ok", "steps_done": 3}
    rows = [{**base, "id": "a", "skipped_steps": 2},  # first step only: redone
            {**base, "id": "b", "skipped_steps": 0},  # steady: kept
            {**base, "id": "c", "skipped_steps": 2}, {**base, "id": "c", "skipped_steps": 0},  # re-run
            {**base, "id": "d", "row": "stage 2 + CPU offload", "skipped_steps": 2}]  # moments on host
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert grid_tool.finished_ids(out) == {"a", "b", "c", "d"}
    assert grid_tool.finished_ids(out, redo_first_step=True) == {"b", "c", "d"}
