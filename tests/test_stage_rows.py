"""Notebook 05's matrix runs its lesson cell's configs: the cell's own definitions (ZERO_ROWS,
row_config, ROW_CONFIGS) executed as the notebook defines them, an edit to the cell reaching the
config a run gets, and the checks that notice when a run lost one of the cell's keys."""

from __future__ import annotations

import pytest

from helpers import config, runner
from helpers import env as kit_env
from helpers.lessons import stages_and_offload as lesson
from tests.lesson_code import definitions, lesson_sources, parameter

STEM = "05_stages_and_offload"
STAGE_3 = '"stage 3": {"stage": 3},'


def _lesson_cell() -> str:
    """Notebook 05's two lesson cells that make the rows, as one source: the cell that defines
    ``stage0_config``, ``zero_rows`` and ``row_config`` (exported to helpers/taught.py) and the cell
    that builds ROW_CONFIGS with them."""
    defining = [s for s in lesson_sources(STEM) if "def zero_rows(" in s]
    building = [s for s in lesson_sources(STEM) if "ZERO_ROWS = zero_rows(" in s]
    assert len(defining) == len(building) == 1, "notebook 05 should define and build its rows once"
    return defining[0] + "\n" + building[0]


def _lesson(tmp_path, source: str | None = None) -> dict:
    """The lesson cell's definitions, run with the parameters it reads (a CPU's fp32)."""
    namespace = {"MICRO_BATCH": 2, "PRECISION": "fp32", "WORK_DIR": str(tmp_path)}
    exec(definitions(source or _lesson_cell()), namespace)
    return namespace


def _ran(monkeypatch, configs: dict[str, dict] | None) -> tuple[list[runner.Row], dict[str, dict]]:
    """run_matrix with each run replaced by a note of the config it was given."""
    seen = {}

    def measure(spec, log_path=None):
        seen[spec.label] = spec.ds_config
        return runner.RunResult(spec.label, runner.OK, losses=[1.0, 0.5])

    monkeypatch.setattr(runner, "measure", measure)
    rows = runner.run_matrix("tiny", kit_env.describe(), 2, 64, 2, configs=configs, progress=False)
    return rows, seen


def test_the_matrix_runs_every_key_the_lesson_cell_writes(monkeypatch, tmp_path):
    written = _lesson(tmp_path)["ROW_CONFIGS"]
    rows, ran = _ran(monkeypatch, written)
    assert list(ran) == list(written)
    for label, cfg in written.items():
        flat, wanted = lesson.flatten(ran[label]), lesson.flatten(cfg)
        assert {k: flat.get(k) for k in wanted} == wanted, label
    assert ran["stage 3 + NVMe offload"]["zero_optimization"]["offload_param"]["nvme_path"] == (
        str(tmp_path / "offload"))
    checks = lesson.lesson_keys_claims(_lesson(tmp_path)["ZERO_ROWS"], rows)
    assert checks and all(ok for _, ok in checks), checks


def test_editing_the_stage_3_row_in_the_lesson_cell_changes_what_the_matrix_runs(monkeypatch, tmp_path):
    cell = _lesson_cell()
    assert cell.count(STAGE_3) == 1, "the test edits notebook 05's stage 3 row as written"
    edited = cell.replace(STAGE_3, '"stage 3": {"stage": 3, "stage3_max_live_parameters": 12345},')
    _, before = _ran(monkeypatch, _lesson(tmp_path)["ROW_CONFIGS"])
    _, after = _ran(monkeypatch, _lesson(tmp_path, edited)["ROW_CONFIGS"])
    assert before["stage 3"]["zero_optimization"]["stage3_max_live_parameters"] != 12345
    assert after["stage 3"]["zero_optimization"]["stage3_max_live_parameters"] == 12345
    assert {k: v for k, v in after.items() if k != "stage 3"} == {
        k: v for k, v in before.items() if k != "stage 3"}


def test_the_key_check_fails_when_the_matrix_ran_the_kits_rows_instead(monkeypatch, tmp_path):
    edited = _lesson(tmp_path, _lesson_cell().replace(
        STAGE_3, '"stage 3": {"stage": 3, "stage3_max_live_parameters": 12345},'))
    rows, _ = _ran(monkeypatch, None)  # the kit's rows, not the lesson's
    failed = [name for name, ok in lesson.lesson_keys_claims(edited["ZERO_ROWS"], rows) if not ok]
    assert failed[0] == ("stage 3: the config that ran sets the lesson's keys "
                         "(not: stage3_max_live_parameters=12345 (ran 100000000))"), failed
    # and the kit's own NVMe folder is not the one the lesson wrote
    assert failed[1:] == [f"stage 3 + NVMe offload: the config that ran sets the lesson's keys (not: "
                          f"offload_optimizer.nvme_path={str(tmp_path / 'offload')!r} (ran "
                          f"{str(kit_env.default_offload_dir())!r}), offload_param.nvme_path="
                          f"{str(tmp_path / 'offload')!r} (ran {str(kit_env.default_offload_dir())!r}))"]


def test_a_row_the_learner_adds_runs_and_is_checked_like_the_others(monkeypatch, tmp_path):
    """A row that is none of the kit's (stage 2 with its optimizer on NVMe) is run and checked,
    not refused; a matrix that left a lesson row out fails the first check."""
    rows = _lesson(tmp_path)["ZERO_ROWS"]
    rows["stage 2 + NVMe offload"] = {"stage": 2, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(tmp_path)}}
    ran, seen = _ran(monkeypatch, {label: {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero}
                                   for label, zero in rows.items()})
    assert seen["stage 2 + NVMe offload"]["zero_optimization"]["offload_optimizer"]["device"] == "nvme"
    checks = lesson.lesson_keys_claims(rows, ran)
    assert checks and all(ok for _, ok in checks), checks
    fewer = lesson.lesson_keys_claims(rows, ran[:-1])
    assert not dict(fewer)["the matrix ran the lesson's rows"]


def test_an_edit_to_the_exported_rows_reaches_the_command_lines_matrix(monkeypatch, tmp_path):
    """``python -m helpers matrix`` (run_matrix without configs) builds notebook 05's rows with the
    lesson cell's own functions, generated into helpers/taught.py: the stage 3 row edited in the
    cell (and exported) runs edited, and no other row changes."""
    import json

    from helpers import taught
    from tools import nbtool

    path = nbtool.NOTEBOOKS / f"{STEM}.ipynb"
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "def zero_rows(" in nbtool.source(c))
    assert nbtool.source(cell).count(STAGE_3) == 1
    cell["source"] = nbtool.source(cell).replace(
        STAGE_3, '"stage 3": {"stage": 3, "stage3_max_live_parameters": 12345},')
    (tmp_path / path.name).write_text(json.dumps(nb))
    monkeypatch.setattr(nbtool, "ROOT", tmp_path)
    exported: dict = {}
    exec(nbtool.render_taught([tmp_path / path.name]), exported)
    _, before = _ran(monkeypatch, None)
    for name in ("stage0_config", "zero_rows", "row_config"):
        monkeypatch.setattr(taught, name, exported[name])
    _, after = _ran(monkeypatch, None)
    assert before["stage 3"]["zero_optimization"]["stage3_max_live_parameters"] != 12345
    assert after["stage 3"]["zero_optimization"]["stage3_max_live_parameters"] == 12345
    assert {k: v for k, v in after.items() if k != "stage 3"} == {
        k: v for k, v in before.items() if k != "stage 3"}


def test_the_faster_offload_variants_start_from_the_lessons_stage_0_config(tmp_path):
    """Each variant is the lesson's stage-0 config with the variant's block: a learning rate or a
    precision written in the lesson reaches every variant (the kit's defaults did before)."""
    from helpers import memory

    base = _lesson(tmp_path)["STAGE0_CONFIG"]
    base["optimizer"]["params"]["lr"] = 1.234e-4
    info = memory.ModelInfo.for_shape("tiny")
    for name, choice, _ in lesson.VARIANTS:
        ds = lesson.variant_config(name, info, kit_env.describe(), 2, 4, base)
        assert ds["optimizer"]["params"]["lr"] == 1.234e-4, name
        assert ds["scheduler"] == base["scheduler"], name
        assert config.row_choice(ds["zero_optimization"]) == choice, name
    partial = lesson.variant_config(lesson.VARIANTS[2][0], info, kit_env.describe(), 2, 4, base)
    assert partial["zero_optimization"]["offload_optimizer"]["ratio"] == lesson.PARTIAL_RATIO
    assert partial["zero_optimization"]["sub_group_size"]  # the kit's tuning fills the rest


def test_the_lesson_cells_rows_are_the_kits_stage_rows(tmp_path):
    zero_rows = _lesson(tmp_path)["ZERO_ROWS"]
    assert {label: config.row_choice(zero) for label, zero in zero_rows.items()} == dict(
        config.STAGE_ROWS)


@pytest.mark.parametrize("zero, choice", [
    ({"stage": 3}, {"stage": 3}),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}},
     {"stage": 2, "offload_optimizer": "cpu"}),
    ({"offload_param": {"device": "nvme"}}, {"stage": 0, "offload_param": "nvme"}),
])
def test_row_choice_reads_the_stage_and_each_offloads_device(zero, choice):
    assert config.row_choice(zero) == choice


def test_overlaid_keeps_the_learners_values_and_fills_the_rest():
    base = {"a": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5}, "b": [1]}
    over = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "b": [2]}
    assert config.overlaid(base, over) == {
        "a": 1, "zero_optimization": {"stage": 3, "reduce_bucket_size": 5,
                                      "offload_param": {"device": "cpu"}}, "b": [2]}
    assert base["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 5}  # not changed


def test_a_row_that_writes_its_own_accumulation_runs_with_the_total_it_implies(monkeypatch, tmp_path):
    configs = _lesson(tmp_path)["ROW_CONFIGS"]
    configs["stage 2"]["gradient_accumulation_steps"] = 4
    _, ran = _ran(monkeypatch, configs)
    assert ran["stage 2"]["train_batch_size"] == 8  # 2 x 4 x 1, as DeepSpeed derives it, not the kit's 2
    assert ran["stage 2"]["gradient_accumulation_steps"] == 4
    _, kits = _ran(monkeypatch, None)
    assert kits["stage 2"]["train_batch_size"] == 2  # the kit's rows keep theirs


def test_precision_blocks_that_are_off_are_no_difference():
    off = {"fp16": {"enabled": False, "initial_scale_power": 12}, "bf16": {"enabled": False}, "a": 1}
    assert lesson.config_differences(off, {"a": 1}) == []
    assert lesson.config_differences({"fp16": {"enabled": True}, "a": 1}, {"a": 1}) == [
        ("fp16.enabled", True, None)]


RENAMED = {"stage 0": "no ZeRO", "stage 2": "ZeRO-2", "stage 2 + CPU offload": "ZeRO-2, optimizer in RAM",
           "stage 1": "ZeRO-1", "stage 3": "ZeRO-3"}


def test_rows_renamed_in_the_lesson_cell_are_rerun_and_checked_by_what_they_are(monkeypatch, tmp_path):
    """The Llama-style and 2-rank re-runs pick rows by their configs: renaming the lesson's rows
    keeps them (a pick by label ran none of them), and the key checks still hold."""
    cell = _lesson_cell()
    for old, new in RENAMED.items():
        cell = cell.replace(f'"{old}": {{', f'"{new}": {{')
    configs = _lesson(tmp_path, cell)["ROW_CONFIGS"]
    assert set(RENAMED.values()) <= set(configs)
    seen = {}

    def measure(spec, log_path=None):
        seen[spec.label] = spec.ds_config
        return runner.RunResult(spec.label, runner.OK, losses=[1.0, 0.5])

    monkeypatch.setattr(runner, "measure", measure)
    llama = runner.run_matrix("tiny", kit_env.describe(), 2, 64, 2, configs=configs, progress=False,
                              kinds=parameter(STEM, "LLAMA_KINDS"))
    assert [r.label for r in llama] == ["no ZeRO", "ZeRO-2", "ZeRO-2, optimizer in RAM"]
    two = runner.run_matrix("tiny", kit_env.describe(), 2, 64, 2, configs=configs, progress=False,
                            kinds=lesson.TWO_RANK_KINDS)
    assert [r.label for r in two] == ["no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-2, optimizer in RAM"]
    rows = runner.run_matrix("tiny", kit_env.describe(), 2, 64, 2, configs=configs, progress=False)
    checks = lesson.lesson_keys_claims(_lesson(tmp_path, cell)["ZERO_ROWS"], rows)
    assert checks and all(ok for _, ok in checks), checks
    table = lesson.changes_table(_lesson(tmp_path, cell)["ZERO_ROWS"], rows)
    assert dict((r[0], r[1]) for r in table.rows)["ZeRO-2, optimizer in RAM"] == (
        'zero_optimization.offload_optimizer.device = "cpu"; zero_optimization.stage = 2')
