"""helpers.lessons.zero2_training, models, data: offline defaults, the Hub path through a local folder, the callback,
save and reload, resume, and out-of-memory handling."""

import torch
import pytest

import lesson_code
from helpers import claims, config, data, models
from helpers.lessons import zero2_training


def test_offline_corpus_and_chunking():
    text = data.offline_corpus(5000, seed=1)
    assert len(text) == 5000 and text == data.offline_corpus(5000, seed=1) and text != data.offline_corpus(5000, seed=2)
    assert [len(b) for b in data.chunk(list(range(10)), 4)] == [4, 4]
    with pytest.raises(ValueError, match="fewer than one block"):
        data.chunk([1, 2], 4)


def test_byte_tokenizer_round_trip():
    tok = models.ByteTokenizer()
    assert tok.decode(tok.encode("héllo")) == "héllo" and max(tok.encode("ÿ")) < 256


def test_unknown_shape_is_named():
    with pytest.raises(ValueError, match="unknown model shape 'gpt5'"):
        models.gpt2_config("gpt5")


def test_an_offline_model_folder_loads_like_a_hub_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = models.save_offline_model(tmp_path / "gpt2", "tiny")
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    ids = tokenizer("Ada moves 3 red boxes", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "Ada moves 3 red boxes" and torch.isfinite(model(ids, labels=ids).loss)


def blocks(n_chars: int, block: int = 32):
    """The offline corpus as a dataset of byte-token blocks (input_ids and labels)."""
    from datasets import Dataset

    chunks = data.chunk(models.ByteTokenizer().encode(data.offline_corpus(n_chars)), block)
    return Dataset.from_dict({"input_ids": chunks, "labels": [list(c) for c in chunks]})


def tiny_model():
    return models.build_model(models.gpt2_config("tiny", vocab_size=models.ByteTokenizer.vocab_size))


def lesson(out_dir, micro_batch: int = 4) -> dict:
    """Notebook 04's own training_args and train_or_advise (its lesson cells' definitions), with the
    parameters they read: the code a learner copies is the code these tests train with."""
    return lesson_code.lesson_functions(
        "04_zero2_training", ["training_args", "train_or_advise"], OUT_DIR=str(out_dir),
        ds_config=config.load("zero2"), MICRO_BATCH=micro_batch, STEPS=12, LR=3e-3,
        PRECISION="fp32", GRAD_CKPT=False, torch=torch)


def train(taught: dict, model, dataset, **train_kwargs) -> zero2_training.TrainRun:
    """The lesson's Trainer on ``model``, watched by the kit's callback, trained in this process."""
    from transformers import Trainer, default_data_collator

    from helpers import deepspeed_fixes, env

    for _, fix in deepspeed_fixes.FIXES:  # every fix
        fix()
    env.setup_single_process_dist()  # the launcher's variables for one process (the lesson's cell)
    trainer = Trainer(model=model, args=taught["training_args"](), train_dataset=dataset,
                      data_collator=default_data_collator)
    metrics = zero2_training.watch(trainer, tokens_per_step=4 * len(dataset[0]["input_ids"]))
    trainer.train(**train_kwargs)
    return zero2_training.run_of(trainer, metrics, 0.0, 4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    dataset = blocks(40_000)
    return dataset, train(lesson(out), tiny_model(), dataset), out


def test_callback_records_every_step(trained):
    _, run, _ = trained
    assert run.status == "ok" and [r["step"] for r in run.records] == list(range(1, 13))
    assert all({"loss", "lr", "tokens_per_s", "host_rss_bytes", "skipped_steps"} <= set(r) for r in run.records)
    assert run.records[0]["lr"] == pytest.approx(3e-3)
    assert claims.loss_falls(run.losses()), run.losses()
    assert "steps" in str(zero2_training.summary_table(run, __import__("helpers.env", fromlist=["x"]).describe()))


def test_save_reload_gives_equal_logits(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    dataset, run, _ = trained
    run.trainer.save_model(str(tmp_path / "model"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    probe = torch.tensor([dataset[0]["input_ids"]])
    assert zero2_training.logit_difference(run.trainer.model, reloaded, probe) <= 1e-5
    with torch.no_grad():
        reloaded.lm_head.weight.add_(0.1)  # a model that is not the same must show a difference
    assert zero2_training.logit_difference(run.trainer.model, reloaded, probe) > zero2_training.reload_tolerance("fp32")
    with torch.no_grad():  # other weights (a reload of the untrained model, say): past half precision's too
        reloaded.lm_head.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
    assert zero2_training.logit_difference(run.trainer.model, reloaded, probe) > zero2_training.reload_tolerance("fp16")


def test_resume_continues_at_the_same_step_and_loss(trained):
    dataset, run, out = trained
    resumed = train(lesson(out), tiny_model(), dataset,
                    resume_from_checkpoint=str(out / "checkpoint-6"))
    first, again = zero2_training.logged_losses(run.trainer), resumed.losses_by_step()
    assert min(again) == 7 and zero2_training.resumed_like(first, again, 6, rtol=1e-4) == (True, True)
    assert zero2_training.resumed_like(first, again, 5, rtol=1e-4) == (False, True)
    assert zero2_training.resumed_like(first, {s: x * 1.1 for s, x in again.items()}, 6, rtol=1e-4) == (True, False)
    assert zero2_training.resumed_like(first, {}, 6, rtol=1e-4) == (False, False)


def test_the_lessons_out_of_memory_handling_gives_advice_and_the_next_run_works(tmp_path):
    """Notebook 04's train_or_advise: CUDA's out-of-memory error (raised by the kit's callback on
    a CPU) becomes the advice the claim wants; the same model then trains in a new Trainer."""
    from transformers import Trainer, default_data_collator

    from helpers import env

    taught, model, dataset = lesson(tmp_path), tiny_model(), blocks(20_000)
    env.setup_single_process_dist()
    too_big = Trainer(model=model, args=taught["training_args"](), train_dataset=dataset,
                      data_collator=default_data_collator,
                      callbacks=[zero2_training.SimulatedOutOfMemory()])
    advice = taught["train_or_advise"](too_big)
    assert advice.startswith("out of GPU memory at micro batch 4: lower per_device_train_batch_size")
    assert zero2_training.oom_claim(advice)[1] and too_big.deepspeed is None
    assert not zero2_training.oom_claim("")[1]  # a run that trained has no advice to claim
    assert not zero2_training.oom_claim("out of GPU memory: try again")[1]  # names no setting
    again = train(taught, model, dataset)
    assert claims.loss_falls(again.losses()), again.losses()


def test_the_lessons_handling_lets_other_errors_through(tmp_path):
    from transformers import Trainer, TrainerCallback, default_data_collator

    class Broken(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            raise RuntimeError("expected all tensors to be on the same device")

    taught = lesson(tmp_path)
    trainer = Trainer(model=tiny_model(), args=taught["training_args"](),
                      train_dataset=blocks(20_000), data_collator=default_data_collator,
                      callbacks=[Broken()])
    with pytest.raises(RuntimeError, match="same device"):
        taught["train_or_advise"](trainer)


def test_notebook_checks_fail_on_a_bad_run(trained):
    _, run, _ = trained
    from helpers import env

    broken = zero2_training.TrainRun("error", "boom", run.records[:2])
    advice = ("out of GPU memory at micro batch 4: lower per_device_train_batch_size and raise "
              "gradient_accumulation_steps")
    good = dict(zero2_training.checks(run, 0.0, (True, True), advice, env.describe(), (7.0, 6.0), 1024))
    assert all(good.values()), good
    bad = dict(zero2_training.checks(broken, 1.0, (False, True), "", env.describe(),
                                     (7.0, 7.5), 1024))
    failed = {k.split(":")[0] for k, held in bad.items() if not held}
    assert {"training ran", "training", "the held-out loss fell (7.0000 -> 7.5000)",
            "the reloaded model gives the same logits",
            "resume continued at the next step", "out of GPU memory was reported with advice"} <= failed
