"""Notebook 07's checks (helpers.lessons.engine_and_accelerate) fail on bad runs: losses that differ at step 1, a path
that recorded nothing, a loss that does not fall (from random weights) or is not finite (from a
pretrained start), a resume that drifted, reloaded logits that differ, ZeRO-3 weights that were not
partitioned, a Trainer whose token count is off, a reloaded model that writes nothing. Each bad input must
fail the claim it is about, and a good run must pass them all (so no test passes by accident)."""

import math
import os
import subprocess
import sys

import pytest
import torch

from helpers import claims, data
from helpers.lessons import engine_and_accelerate

GOOD = [6.02, 6.03, 6.05, 5.75, 5.53, 5.30, 5.09, 4.93, 4.70, 4.47, 4.32, 4.13]  # a tiny GPT-2 from scratch
#: Notebook 07 on a CPU: SmolLM2-135M-Instruct fine-tuned on Python's documentation, 8 steps of
#: 4 x 64 tokens: batch noise, no trend, while the held-out loss fell 3.3959 -> 3.1709. Healthy, and
#: the trend rule fails it.
PRETRAINED = [3.6233, 4.4283, 3.1377, 2.9729, 3.2681, 3.2093, 3.4798, 3.3216]


def held(found, start):
    """Whether the claim(s) whose sentence starts with ``start`` held; the claim must be there."""
    matching = [ok for sentence, ok in found if sentence.startswith(start)]
    assert matching, f"no claim starts with {start!r}: {[s for s, _ in found]}"
    return all(matching)


def three(engine=GOOD, accelerate=GOOD, trainer=GOOD):
    return {"engine": list(engine), "accelerate": list(accelerate), "trainer": list(trainer)}


# ---- the three-way comparison ------------------------------------------------------------------------


def test_identical_paths_pass_every_claim():
    found = engine_and_accelerate.compare(three(), "fp32", steps=len(GOOD))
    assert claims.failed(found) == []
    assert len(found) == 8  # recorded, steps, step 1, two every-step claims, three loss-falls claims


def test_rounding_noise_within_the_fp32_tolerance_passes():
    noisy = [x * (1 + 5e-5 * (-1) ** i) for i, x in enumerate(GOOD)]
    assert claims.failed(engine_and_accelerate.compare(three(trainer=noisy), "fp32")) == []


def test_losses_that_differ_at_step_one_fail_the_first_step_claim():
    # The Trainer's count without model.loss_type on GPT-2: every loss (BLOCK - 1) / BLOCK of the engine's.
    scaled = [x * 63 / 64 for x in GOOD]
    found = engine_and_accelerate.compare(three(trainer=scaled), "fp32")
    assert not held(found, "step 1:")
    assert not held(found, "trainer: every step")
    assert held(found, "accelerate: every step")
    assert held(found, "trainer: the loss falls")  # its curve still falls: only the comparison catches it


def test_a_drift_after_step_one_fails_only_the_every_step_claim():
    drifted = GOOD[:6] + [x * 1.01 for x in GOOD[6:]]
    found = engine_and_accelerate.compare(three(accelerate=drifted), "fp32")
    assert held(found, "step 1:")
    assert not held(found, "accelerate: every step")
    assert held(found, "trainer: every step")


def test_fp16_allows_what_fp32_refuses():
    drifted = GOOD[:1] + [x * 1.03 for x in GOOD[1:]]
    assert not held(engine_and_accelerate.compare(three(trainer=drifted), "fp32"), "trainer: every step")
    assert held(engine_and_accelerate.compare(three(trainer=drifted), "fp16"), "trainer: every step")
    assert not held(engine_and_accelerate.compare(three(trainer=[x * 1.08 for x in GOOD]), "fp16"), "trainer: every step")


def test_a_path_that_recorded_nothing_fails():
    found = engine_and_accelerate.compare(three(accelerate=[]), "fp32", steps=len(GOOD))
    assert not held(found, "every path recorded its losses")
    assert not held(found, "every path ran the same")
    assert not held(found, "step 1:")
    assert not held(found, "accelerate: every step")
    assert not held(found, "accelerate: the loss falls")
    assert held(found, "trainer: every step")


def test_a_missing_reference_fails_everything_it_anchors():
    found = engine_and_accelerate.compare({"accelerate": GOOD, "trainer": GOOD}, "fp32", steps=len(GOOD))
    assert not held(found, "every path recorded its losses")
    assert not held(found, "step 1:")
    assert not held(found, "accelerate: every step")


def test_an_empty_comparison_fails():
    found = engine_and_accelerate.compare({}, "fp32")
    assert not held(found, "every path recorded its losses")
    assert not held(found, "every path ran the same")
    assert not held(found, "step 1:")
    with pytest.raises(AssertionError):
        claims.assert_all(found)


def test_the_reference_alone_is_no_comparison():
    found = engine_and_accelerate.compare({"engine": GOOD}, "fp32")
    assert not held(found, "every path recorded its losses")
    assert not held(found, "step 1:")


def test_a_path_that_ran_fewer_steps_fails():
    found = engine_and_accelerate.compare(three(trainer=GOOD[:-2]), "fp32", steps=len(GOOD))
    assert not held(found, "every path ran the same")
    assert not held(found, "trainer: every step")


def test_a_loss_that_does_not_fall_fails_on_every_path():
    flat = [6.0] * len(GOOD)
    found = engine_and_accelerate.compare(three(flat, flat, flat), "fp32")
    assert held(found, "step 1:") and held(found, "trainer: every step")  # they agree, and still
    for path in ("engine", "accelerate", "trainer"):
        assert not held(found, f"{path}: the loss falls")


def test_a_healthy_pretrained_run_fails_the_trend_rule_and_passes_as_a_fine_tune():
    found = engine_and_accelerate.compare(three(PRETRAINED, PRETRAINED, PRETRAINED), "fp32")
    assert not held(found, "engine: the loss falls")  # why the trend rule is not asked of it
    found = engine_and_accelerate.compare(three(PRETRAINED, PRETRAINED, PRETRAINED), "fp32",
                                          steps=len(PRETRAINED), pretrained=True)
    assert claims.failed(found) == []
    assert held(found, "engine from a pretrained start")


@pytest.mark.parametrize("bad, why", [
    (PRETRAINED[:-1] + [math.nan], "a loss that is not a number"),
    (PRETRAINED[:3] + [math.inf] + PRETRAINED[4:], "an overflowed loss"),
])
def test_a_pretrained_run_with_a_loss_that_is_not_finite_fails(bad, why):
    found = engine_and_accelerate.compare(three(bad, bad, bad), "fp32", pretrained=True)
    assert not held(found, "engine from a pretrained start"), why


def test_a_pretrained_run_too_short_to_judge_fails():
    found = engine_and_accelerate.compare(three(*[PRETRAINED[:2]] * 3), "fp32", pretrained=True)
    assert not held(found, "trainer from a pretrained start")


def test_a_diverging_loss_fails():
    found = engine_and_accelerate.compare(three(*[GOOD[:-1] + [math.nan]] * 3), "fp32")
    assert not held(found, "engine: the loss falls")


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp8"):
        engine_and_accelerate.compare(three(), "fp8")


def test_the_tolerances_are_the_stated_ones():
    assert (engine_and_accelerate.tolerance("fp32").first_step, engine_and_accelerate.tolerance("fp32").every_step) == (1e-4, 1e-3)
    assert (engine_and_accelerate.tolerance("fp16").first_step, engine_and_accelerate.tolerance("fp16").every_step) == (1e-3, 5e-2)
    assert (engine_and_accelerate.tolerance("bf16").first_step, engine_and_accelerate.tolerance("bf16").every_step) == (1e-3, 5e-2)


# ---- resume, reload, ZeRO-3, the Trainer's count ---------------------------------------------------------


def test_resume_that_reproduces_the_losses_passes():
    assert engine_and_accelerate.resume_claim(GOOD, GOOD[6:8], 6, "fp32")[1]


@pytest.mark.parametrize("resumed, start, why", [
    ([GOOD[6] * 1.01, GOOD[7]], 6, "the first resumed loss drifted (optimizer state lost)"),
    (GOOD[5:7], 6, "resumed one step early"),
    ([], 6, "nothing resumed"),
    (GOOD[10:12] + [4.0], 10, "past the end of the uninterrupted run"),
])
def test_a_bad_resume_fails(resumed, start, why):
    assert not engine_and_accelerate.resume_claim(GOOD, resumed, start, "fp32")[1], why


def test_reloaded_logits_that_match_pass():
    logits = torch.randn(2, 8, 16)
    assert engine_and_accelerate.logits_claim("x", engine_and_accelerate.logit_difference(logits, logits.clone()), "fp32")[1]


@pytest.mark.parametrize("change, why", [
    (lambda t: t + 1e-2, "a shifted model"),
    (lambda t: t * 0.9, "a scaled model"),
    (lambda t: t[:, :4], "a different shape"),
    (lambda t: torch.full_like(t, math.nan), "not finite"),
    (lambda t: torch.randn_like(t), "another model"),
])
def test_reloaded_logits_that_differ_fail(change, why):
    logits = torch.randn(2, 8, 16)
    diff = engine_and_accelerate.logit_difference(logits, change(logits))
    assert not engine_and_accelerate.logits_claim("reload", diff, "fp32")[1], why


def test_logit_tolerance_follows_the_precision():
    logits = torch.randn(2, 8, 16)
    diff = engine_and_accelerate.logit_difference(logits, logits * (1 + 5e-3))
    assert not engine_and_accelerate.logits_claim("x", diff, "fp32")[1]
    assert engine_and_accelerate.logits_claim("x", diff, "fp16")[1]
    assert not engine_and_accelerate.logits_claim("x", None, "fp32")[1]


def test_zero3_partitioned_only_when_the_module_holds_nothing():
    assert engine_and_accelerate.zero3_partitioned_claim(0, 191_808)[1]
    assert not engine_and_accelerate.zero3_partitioned_claim(191_808, 191_808)[1]  # gathered: not what ZeRO-3 leaves
    assert not engine_and_accelerate.zero3_partitioned_claim(0, 0)[1]  # no model at all


def test_partition_counts_of_a_plain_module_fail_the_zero3_claim():
    module = torch.nn.Linear(4, 3)
    assert engine_and_accelerate.partition_counts(module) == (15, 15)
    assert not engine_and_accelerate.zero3_partitioned_claim(*engine_and_accelerate.partition_counts(module))[1]


def test_partition_counts_read_deepspeeds_full_sizes():
    module = torch.nn.Linear(4, 3)
    for param in module.parameters():  # what ZeRO-3 leaves: an empty placeholder and the full size
        param.ds_numel, param.ds_shape = param.numel(), param.shape
        param.data = torch.empty(0)
    assert engine_and_accelerate.partition_counts(module) == (0, 15)
    assert engine_and_accelerate.zero3_partitioned_claim(*engine_and_accelerate.partition_counts(module))[1]
    assert "(0,)" in str(engine_and_accelerate.partition_table(module))


def test_zero3_losses_must_match_stage2s():
    assert engine_and_accelerate.matches_claim("ZeRO-3", GOOD[:4], GOOD, "fp32")[1]
    assert not engine_and_accelerate.matches_claim("ZeRO-3", [x * 1.01 for x in GOOD[:4]], GOOD, "fp32")[1]
    assert not engine_and_accelerate.matches_claim("ZeRO-3", [], GOOD, "fp32")[1]
    assert not engine_and_accelerate.matches_claim("ZeRO-3", GOOD[:4], GOOD[:2], "fp32")[1]


def test_the_trainer_count_claim():
    assert engine_and_accelerate.trainer_count_claim(GOOD[0] * 63 / 64, GOOD[0], 63 / 64, "fp32")[1]
    assert not engine_and_accelerate.trainer_count_claim(GOOD[0], GOOD[0], 63 / 64, "fp32")[1]  # predicted a bias, saw none
    assert not engine_and_accelerate.trainer_count_claim(GOOD[0] * 63 / 64, GOOD[0], 1.0, "fp32")[1]
    assert not engine_and_accelerate.trainer_count_claim(None, GOOD[0], 1.0, "fp32")[1]


def test_expected_trainer_ratio_by_model_class(tmp_path):
    from transformers import GPT2Config, LlamaConfig

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64).save_pretrained(tmp_path / "gpt2")
    LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                num_key_value_heads=2, vocab_size=64).save_pretrained(tmp_path / "llama")
    assert engine_and_accelerate.expected_trainer_ratio(str(tmp_path / "gpt2"), 64) == pytest.approx(63 / 64)
    assert engine_and_accelerate.expected_trainer_ratio(str(tmp_path / "llama"), 64) == 1.0


def test_the_reloaded_model_must_write_something():
    assert engine_and_accelerate.continuation_claim("The for statement", " iterates", " loops")[1]
    assert engine_and_accelerate.continuation_claim("The for statement", " iterates", " iterates")[1]
    for empty in ("", "   ", "\n\n"):  # only special tokens, decoded without them; or blanks
        assert not engine_and_accelerate.continuation_claim("The for statement", " x", empty)[1]


def test_the_takeaways_quote_the_held_out_loss_and_the_samples():
    lines = engine_and_accelerate.takeaways(
        three(PRETRAINED, PRETRAINED, PRETRAINED), "fp32", 2, 4, True, 0.0, (0, 10), 0.0, 1.0, 1.0,
        held_out=(3.3959, 3.1709), samples=("The for statement", " a", " b"))
    assert "from 3.3959 to 3.1709 (lower)" in lines[0] and "' b'" in lines[1]
    worse = engine_and_accelerate.takeaways(
        three(), "fp32", 2, 4, True, 0.0, (0, 10), 0.0, 1.0, 1.0, held_out=(3.3, 3.5))
    assert "NOT lower" in worse[0]


def test_the_trainer_sentence_says_which_case():
    assert "1.56% low" in engine_and_accelerate.trainer_sentence(63 / 64, 63 / 64)
    assert "0.39% low" in engine_and_accelerate.trainer_sentence(255 / 256, 255 / 256)  # not "already names": bf16 ran so
    assert "already names" in engine_and_accelerate.trainer_sentence(1.0, 1.0)
    assert "not measured" in engine_and_accelerate.trainer_sentence(None, 1.0)


def test_the_first_step_tolerance_catches_the_trainer_miscount_at_full_size():
    scaled = [x * 255 / 256 for x in GOOD]  # BLOCK 256, the GPU's full size
    for precision in engine_and_accelerate.TOLERANCES:
        assert not held(engine_and_accelerate.compare(three(trainer=scaled), precision), "step 1:"), precision


# ---- offline files, table, plot ------------------------------------------------------------------------


def test_resolve_model_prefers_a_folder_then_the_hub_then_offline(tmp_path, monkeypatch):
    from helpers import models

    written = []
    monkeypatch.setattr(models, "_save_in_a_subprocess", lambda folder, shape, *a: written.append(folder))
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    name, note = models.resolve_model(None, tmp_path, "tiny")
    assert name == str(tmp_path / "offline-tiny") and written and "no MODEL_NAME" in note
    name, note = models.resolve_model("HuggingFaceTB/SmolLM2-135M", tmp_path, "tiny")
    assert name == str(tmp_path / "offline-tiny") and "cannot be reached" in note
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: True)
    assert models.resolve_model("HuggingFaceTB/SmolLM2-135M", tmp_path, "tiny")[0] == "HuggingFaceTB/SmolLM2-135M"
    assert models.resolve_model(str(tmp_path), tmp_path, "tiny")[0] == str(tmp_path)


def test_resolve_text_keeps_a_file_and_writes_the_corpus_otherwise(tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("hello\n")
    assert data.resolve_text(str(mine), tmp_path, 1000) == str(mine)
    written = data.resolve_text(None, tmp_path, 1000)  # Python's documentation, cut at a line's end
    text = open(written).read()
    assert written != str(mine) and 0 < len(text) <= 1000 and text.endswith("\n")
    with pytest.raises(FileNotFoundError, match="TEXT_FILE .* is not a file"):  # a typo, not the corpus
        data.resolve_text(str(tmp_path / "typo.txt"), tmp_path, 1000)


WIKI = ("Salesforce/wikitext", "wikitext-2-raw-v1")


def test_resolve_text_source_prefers_your_file_then_the_dataset_then_the_corpus(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=3.0: False)
    mine = tmp_path / "mine.txt"
    mine.write_text("hello\n")
    assert data.resolve_text_source(WIKI, str(mine), tmp_path, 1000)[:2] == (None, str(mine))
    dataset, text, note = data.resolve_text_source(WIKI, None, tmp_path, 1000)  # offline, not cached
    assert dataset is None and len(open(text).read()) == 1000
    assert "offline corpus" in note and "cannot be reached" in note
    data.write_datasets_cache(mine, *WIKI)  # as load_dataset leaves it once downloaded
    assert data.datasets_cached(*WIKI) and not data.datasets_cached(WIKI[0], "wikitext-103-raw-v1")
    dataset, text, note = data.resolve_text_source(WIKI, None, tmp_path, 1000)
    assert dataset == WIKI and text is None and "cache" in note
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty")
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=3.0: True)
    assert data.resolve_text_source(WIKI, None, tmp_path, 1000)[0] == WIKI


def test_a_written_datasets_cache_loads_by_its_hub_name_offline(tmp_path):
    """The Hub-name path with no network: load_dataset(name, configuration) finds the cache."""
    text = data.write_offline_text(tmp_path / "t.txt", 2000)
    data.write_datasets_cache(text, "zero-kit-offline/corpus", "wiki", cache_dir=tmp_path / "ds")
    code = ("import datasets; d = datasets.load_dataset('zero-kit-offline/corpus', 'wiki', "
            "split='train'); print('ROWS', len(d), d[0]['text'][:20])")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "ds"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    rows = open(text).read().splitlines()
    assert f"ROWS {len(rows)} {rows[0][:20]}" in done.stdout, done.stdout + done.stderr[-2000:]


def test_table_and_plot_show_every_path():
    import matplotlib

    matplotlib.use("agg")
    losses = three(trainer=[x * 1.0005 for x in GOOD])
    text = str(engine_and_accelerate.table(losses))
    assert all(path in text for path in ("engine", "accelerate", "trainer")) and "5.0e-04" in text
    fig = engine_and_accelerate.plot(losses, "fp32")
    left, right = fig.axes
    assert [line.get_label() for line in left.get_lines()] == list(losses)
    assert right.get_ylim()[1] >= 3 * engine_and_accelerate.tolerance("fp32").every_step
