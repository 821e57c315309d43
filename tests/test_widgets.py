"""helpers.lessons.config_builder: the form drives the same helpers as the plain cells, and its checks can fail."""

from helpers import env
from helpers.lessons import config_builder


def test_form_checks_all_hold_and_leave_the_form_as_it_was(tmp_path):
    form = config_builder.ConfigForm(env.describe(), shape="tiny", micro_batch=2, seq_len=64, folder=tmp_path)
    before = form.values()
    results = config_builder.form_checks(form)
    assert results and all(held for _, held in results), results
    assert form.values() == before


def test_save_writes_a_file_and_refuses_errors(tmp_path):
    form = config_builder.ConfigForm(env.describe(), shape="tiny", folder=tmp_path)
    form.name.value = "from_form"
    path = form.save()
    assert path == tmp_path / "from_form.json" and path.exists() and "saved" in form.status.value
    (tmp_path / "from_form.json").unlink()
    form.set(precision="bf16")  # no native bf16 on this CPU: the form's own check turns it into an error
    assert any(p.level == "error" and p.path == "bf16.enabled" for p in form.problems)
    assert form.save() is None and "not saved" in form.status.value and not path.exists()


class BrokenForm(config_builder.ConfigForm):
    """A form whose control callback stops updating after the first render."""

    def refresh(self, _change=None):
        if not self.config:
            super().refresh()


def test_a_broken_refresh_is_caught_by_the_checks(tmp_path):
    form = BrokenForm(env.describe(), shape="tiny", folder=tmp_path)
    failed = [claim for claim, held in config_builder.form_checks(form) if not held]
    assert "stage 3 + NVMe: the JSON preview follows the controls" in failed


def test_notebook_03s_summary_names_the_run_its_lesson_config_made():
    """The measured line names the run by what ran (the lesson's config: its label says the
    stage), with its peak; no line without a successful run."""
    from helpers import memory, runner

    machine = env.describe()
    info = memory.ModelInfo.for_shape("tiny")
    ran = runner.RunResult("stage 3", runner.OK, peak_gpu_allocated_bytes=2**30,
                           peak_host_rss_bytes=3 * 2**29)
    lines = config_builder.prediction_takeaways(info, machine, 9, 10, ran, 2, 64)
    measured = [line for line in lines if line.startswith("Measured")]
    peak = "1.00" if machine.has_gpu else "1.50"
    assert measured == [f"Measured in a fresh process, the lesson's config (stage 3): peaked at "
                        f"{peak} GiB of {'GPU' if machine.has_gpu else 'host RAM (no GPU here)'}."]
    failed = runner.RunResult("stage 3", "out of GPU memory")
    assert not [line for line in config_builder.prediction_takeaways(info, machine, 9, 10, failed, 2, 64)
                if line.startswith("Measured")]
