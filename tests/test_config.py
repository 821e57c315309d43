"""helpers.config: build, check (each mistake at its key path), explain, save/load, presets."""

import json

import pytest

from helpers import config, env, memory, runner
from helpers.config import ConfigError
from helpers.lessons import config_builder


@pytest.fixture(scope="module")
def machine():
    return env.describe()


def engine(stage=2, **kw):
    return config.build(stage=stage, micro_batch=2, trainer=False, precision="fp16", pin_memory=False, **kw)


def paths(problems):
    return {p.path for p in problems}


def test_build_engine_mode_has_numbers_that_agree():
    c = config.build(stage=2, micro_batch=3, grad_accum=4, world_size=2, trainer=False, precision="fp16", pin_memory=False)
    assert c["train_batch_size"] == 24 and c["fp16"]["enabled"] is True and "bf16" not in c
    assert config.check(c, for_trainer=False, world_size=2) == []


def test_build_trainer_mode_leaves_auto_for_the_trainer():
    c = config.build(stage=3, trainer=True, pin_memory=False)
    assert c["train_micro_batch_size_per_gpu"] == "auto" and c["fp16"]["enabled"] == "auto" and c["bf16"]["enabled"] == "auto"
    assert config.check(c) == []
    assert "auto" in str(config.check(c, for_trainer=False)[0])


def test_build_rejects_bad_choices():
    with pytest.raises(ConfigError, match="stage must be 0, 1, 2 or 3"):
        config.build(stage=4)
    with pytest.raises(ConfigError, match="offload_optimizer must be one of none, cpu, nvme"):
        config.build(offload_optimizer="gpu")


def test_nvme_param_offload_sizes_buffers_and_disables_reuse():
    c = engine(stage=3, offload_optimizer="nvme", offload_param="nvme", largest_param_numel=80_411_200)
    zero = c["zero_optimization"]
    assert zero["offload_param"]["buffer_size"] >= 80_411_200 and zero["stage3_max_reuse_distance"] == 0
    assert "aio" in c


def test_every_mistake_is_caught_at_its_key(machine):
    cases = config_builder.mistakes(engine(), machine)
    assert len(cases) == 10
    missed = [c.name for c in cases if not c.caught]
    assert missed == []
    typo = next(c for c in cases if c.name == "typo at the top level")
    hit = next(p for p in typo.problems if p.path == "fp_16")
    assert "did you mean 'fp16'" in hit.fix and hit.level == "error"


def test_pin_memory_is_a_warning_not_an_error(machine):
    t4 = config.t4_profile(machine)
    c = engine(offload_optimizer="cpu")
    c["zero_optimization"]["offload_optimizer"]["pin_memory"] = True
    found = config.check(c, hardware=t4)
    assert [p.level for p in found if p.path.endswith("pin_memory")] == ["warning"]


def test_a_clean_config_has_no_problems_on_a_t4(machine):
    assert config.check(engine(stage=2, offload_optimizer="cpu"), hardware=config.t4_profile(machine), for_trainer=False) == []


def test_explain_covers_the_settings_present():
    rows = {r[0] for r in config.explain(engine(stage=3)).rows}
    assert {"zero_optimization.stage", "fp16", "zero_optimization.stage3_prefetch_bucket_size"} <= rows


def test_save_and_load_round_trip_and_refusals(tmp_path):
    c = engine()
    path = config.save(c, "mine", tmp_path)
    assert json.loads(path.read_text()) == c
    assert config.load(path) == c
    bad = dict(c, fp_16={"enabled": True})
    config.save(bad, "typo", tmp_path)
    with pytest.raises(ConfigError, match=r"(?s)typo.json has 1 error.*fp_16"):
        config.load(tmp_path / "typo.json")
    with pytest.raises(ConfigError, match="no folders"):
        config.save(c, "../escape", tmp_path)
    with pytest.raises(ConfigError, match="no config at"):
        config.load(tmp_path / "nothing.json")


def test_for_engine_fills_every_auto():
    filled = config.for_engine(config.presets()["zero2"], micro_batch=2, precision="fp32")
    assert config.check(filled, for_trainer=False) == []
    assert filled["fp16"]["enabled"] is False and filled["train_batch_size"] == 2


@pytest.mark.parametrize("name", sorted(config.presets()))
def test_every_preset_passes_check_and_starts_an_engine(name):
    preset = config.presets()[name]
    assert [p for p in config.check(preset) if p.level == "error"] == []
    filled = config.for_engine(preset, micro_batch=2, precision="fp32")
    if "nvme" in json.dumps(filled):


        # Never skipped: CI installs libaio-dev and fails when it cannot, so the NVMe row runs there.
        assert env.libaio_available(), "libaio is missing: apt-get install -y libaio-dev"
        info = memory.ModelInfo.for_shape("tiny")
        filled["zero_optimization"]["offload_param"]["buffer_size"] = int(1.05 * info.largest_param_numel)
        filled["zero_optimization"]["sub_group_size"] = 1_000_000
    result = runner.measure(runner.RunSpec(ds_config=filled, shape="tiny", steps=1, force_cpu=True, label=name))
    assert result.status == runner.OK, result.message
    # The NVMe preset really wrote its swap files (ZeRO-3 + NVMe on the CPU: helpers.deepspeed_fixes).
    assert (result.peak_nvme_bytes > 0) == ("nvme" in json.dumps(filled))
