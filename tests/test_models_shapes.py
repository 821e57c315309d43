"""Modern model shapes (issue 15, item 5): Llama/Qwen-style models (RMSNorm, SwiGLU, grouped-query
attention, rotary) built offline from a transformers config, sized like the real checkpoints, usable
everywhere a GPT-2 shape is (model_config, ModelInfo, the offline model folder, bench)."""

import math
from pathlib import Path

import pytest
import torch

import helpers
from helpers import claims, cli, config, memory, models, runner, taught

LLAMA_STYLE = list(models.LLAMA_SHAPES)

#: Published sizes of the checkpoints (model cards / Hub), in parameters.
PUBLISHED = {
    "smollm2-135m-shaped": 134.5e6,  # HuggingFaceTB/SmolLM2-135M
    "smollm2-360m-shaped": 361.8e6,  # HuggingFaceTB/SmolLM2-360M
    "qwen2.5-0.5b-shaped": 494.0e6,  # Qwen/Qwen2.5-0.5B ("0.49B")
    "qwen2.5-1.5b-shaped": 1.544e9,  # Qwen/Qwen2.5-1.5B ("1.54B")
    "llama-3.2-1b-shaped": 1.236e9,  # meta-llama/Llama-3.2-1B ("1.23B")
    "llama-3.2-3b-shaped": 3.213e9,  # meta-llama/Llama-3.2-3B ("3.21B")
    "tinyllama-1.1b-shaped": 1.100e9,  # TinyLlama/TinyLlama-1.1B
}

#: The checkpoints' config.json numbers: layers, hidden, heads, KV heads, intermediate, vocab, tied, rope theta.
REAL_NUMBERS = {
    "smollm2-135m-shaped": (30, 576, 9, 3, 1536, 49152, True, 1e5),
    "smollm2-360m-shaped": (32, 960, 15, 5, 2560, 49152, True, 1e5),
    "qwen2.5-0.5b-shaped": (24, 896, 14, 2, 4864, 151936, True, 1e6),
    "qwen2.5-1.5b-shaped": (28, 1536, 12, 2, 8960, 151936, True, 1e6),
    "llama-3.2-1b-shaped": (16, 2048, 32, 8, 8192, 128256, True, 5e5),
    "llama-3.2-3b-shaped": (28, 3072, 24, 8, 8192, 128256, True, 5e5),
    "tinyllama-1.1b-shaped": (22, 2048, 32, 4, 5632, 32000, False, 1e4),
}


def _arithmetic_params(layers, hidden, heads, kv_heads, inner, vocab, tied, qkv_bias=False):
    """The parameter count a Llama block stack has by construction, without transformers."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    attn = hidden * hidden + 2 * hidden * kv + hidden * hidden + (hidden + 2 * kv if qkv_bias else 0)
    block = attn + 3 * hidden * inner + 2 * hidden  # q, k, v, o; gate, up, down; two RMSNorm weights
    return layers * block + hidden + vocab * hidden * (1 if tied else 2)  # + final norm, embeddings (and head)


def _rope_theta(cfg):
    params = getattr(cfg, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(cfg, "rope_theta", None))


@pytest.mark.parametrize("shape", list(PUBLISHED))
def test_real_sized_shapes_match_the_checkpoints(shape):
    layers, hidden, heads, kv_heads, inner, vocab, tied, theta = REAL_NUMBERS[shape]
    cfg = models.model_config(shape)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (layers, hidden, heads, kv_heads,
                                                                               inner, vocab, tied)
    assert _rope_theta(cfg) == theta and cfg.use_cache is False and cfg.attention_dropout == 0.0
    info = memory.ModelInfo.for_shape(shape)  # counted on the meta device
    expected = _arithmetic_params(layers, hidden, heads, kv_heads, inner, vocab, tied, qkv_bias=shape.startswith("qwen"))
    assert info.n_params == expected, (shape, info.n_params, expected)
    assert abs(info.n_params - PUBLISHED[shape]) <= 0.02 * PUBLISHED[shape], (shape, info.n_params, PUBLISHED[shape])
    # the largest tensor is the embedding (vocab x hidden), what NVMe buffers must hold
    assert info.largest_param_numel == vocab * hidden
    assert (info.intermediate, info.kv_heads, info.tied, info.family) == (
        inner, kv_heads, tied, "qwen2" if shape.startswith("qwen") else "llama")


def test_llama_3_2_keeps_its_long_context_rope_scaling():
    cfg = models.model_config("llama-3.2-1b-shaped")
    scaling = getattr(cfg, "rope_parameters", None) or cfg.rope_scaling
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 32.0
    assert cfg.max_position_embeddings == 131072 and (cfg.bos_token_id, cfg.eos_token_id) == (128000, 128001)


@pytest.mark.parametrize("shape", LLAMA_STYLE)
def test_llama_style_shapes_have_rmsnorm_swiglu_gqa_and_rotary(shape):
    cfg = models.model_config(shape, vocab_size=512)
    with torch.device("meta"):
        model = models.build_model(cfg)
    kinds = {type(m).__name__ for m in model.modules()}
    assert any(k.endswith("RMSNorm") for k in kinds) and not any(k == "LayerNorm" for k in kinds), kinds
    block = model.model.layers[0]
    assert type(block.input_layernorm).__name__.endswith("RMSNorm")
    # SwiGLU: down(silu(gate(x)) * up(x))
    mlp = block.mlp
    assert (mlp.gate_proj.out_features, mlp.up_proj.out_features, mlp.down_proj.in_features) == (
        cfg.intermediate_size,) * 3 and cfg.hidden_act == "silu"
    # grouped-query attention: fewer key/value heads than query heads (SmolLM2-1.7B's checkpoint
    # keeps all 32, as its config.json says)
    attn, head_dim = block.self_attn, cfg.hidden_size // cfg.num_attention_heads
    full_heads = {"smollm2-1.7b-shaped"}
    assert (cfg.num_key_value_heads == cfg.num_attention_heads if shape in full_heads
            else cfg.num_key_value_heads < cfg.num_attention_heads)
    assert attn.q_proj.out_features == cfg.num_attention_heads * head_dim
    assert attn.k_proj.out_features == attn.v_proj.out_features == cfg.num_key_value_heads * head_dim
    # rotary positions: a rotary module, no learned position table
    assert any("Rotary" in k for k in kinds) and _rope_theta(cfg) > 0
    assert not any(isinstance(m, torch.nn.Embedding) and m.num_embeddings == cfg.max_position_embeddings
                   for m in model.modules())
    assert "gpt2" not in type(model).__name__.lower() and cfg.vocab_size == 512


def test_gpt2_shapes_are_unchanged_and_dispatched():
    for shape in models.GPT2_SHAPES:
        assert models.model_config(shape).to_dict() == models.gpt2_config(shape).to_dict()
        assert models.shape_family(shape) == "gpt2" and "GPT-2" in models.MODEL_SHAPES[shape]
    assert list(models.MODEL_SHAPES)[:len(models.GPT2_SHAPES)] == list(models.GPT2_SHAPES)
    assert set(models.MODEL_SHAPES) == set(models.GPT2_SHAPES) | set(models.LLAMA_SHAPES)
    assert models.model_config("gpt2-124m", max_positions=2048).n_positions == 2048
    gpt2 = memory.ModelInfo.for_shape("gpt2-124m")
    assert gpt2.n_params == 124_439_808
    assert (gpt2.intermediate, gpt2.kv_heads, gpt2.tied, gpt2.family) == (3072, 12, True, "gpt2")
    # positional construction (tests, from_count) keeps working, with GPT-2 defaults for the new fields
    bare = memory.ModelInfo(10**6, 10, 1, 8, 1, 8)
    assert (bare.name, bare.intermediate, bare.kv_heads, bare.tied) == ("", 32, 1, True)


def test_every_shape_is_described_with_its_family():
    for shape, text in models.MODEL_SHAPES.items():
        family = {"gpt2": "GPT-2", "llama": "Llama", "qwen2": "Qwen2"}[models.shape_family(shape)]
        assert text.startswith(family + " family"), (shape, text)
    assert models.shape_family("qwen2.5-0.5b-shaped") == "qwen2"
    assert type(models.model_config("qwen2.5-0.5b-shaped")).__name__ == "Qwen2Config"
    assert type(models.model_config("smollm2-135m-shaped")).__name__ == "LlamaConfig"


def test_vocab_override_and_context():
    cfg = models.model_config("llama-3.2-1b-shaped", vocab_size=257, max_positions=4096)
    assert cfg.vocab_size == 257 and cfg.bos_token_id < 257 and cfg.eos_token_id < 257
    assert cfg.max_position_embeddings == 131072  # the checkpoint's own context is longer
    assert models.model_config("llama-tiny", max_positions=4096).max_position_embeddings == 4096
    assert memory.ModelInfo.for_shape("smollm2-135m-shaped", vocab_size=257).n_params == (
        memory.ModelInfo.for_shape("smollm2-135m-shaped").n_params - (49152 - 257) * 576)


@pytest.mark.parametrize("shape", ["llama-tiny", "llama-mini"])
def test_small_llama_shapes_train(shape):
    cfg = models.model_config(shape)
    model = models.build_model(cfg, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert n == memory.ModelInfo.from_config(cfg).n_params and (n < 200_000 if shape == "llama-tiny" else 1e6 < n < 10e6), n
    ids = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(cfg.vocab_size)) < 0.3, (losses[0], math.log(cfg.vocab_size))
    assert claims.loss_falls(losses), losses


def test_unknown_shape_names_every_valid_one():
    for call in (models.model_config, models.shape_family, memory.ModelInfo.for_shape):
        with pytest.raises(ValueError, match="unknown model shape 'llama-9000'") as err:
            call("llama-9000")
        assert all(name in str(err.value) for name in models.MODEL_SHAPES), str(err.value)


def test_offline_folder_round_trip_of_a_llama_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = models.save_offline_model(tmp_path / "llama", "llama-tiny")
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "llama" and model.config.num_key_value_heads == 2
    ids = torch.tensor([tokenizer.encode("Ada moves the cart to the mill")])
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(out.loss)
    assert abs(out.loss.item() - math.log(len(tokenizer))) < 0.5
    # ModelInfo from the config alone: the same count with the weights file gone
    (folder / "model.safetensors").unlink()
    info = memory.ModelInfo.from_pretrained(str(folder))
    expected = memory.ModelInfo.for_shape("llama-tiny", vocab_size=len(tokenizer))
    assert (info.n_params, info.largest_param_numel, info.kv_heads, info.intermediate, info.family) == (
        expected.n_params, expected.largest_param_numel, 2, 172, "llama")
    assert info.n_params == sum(p.numel() for p in model.parameters())


def test_a_hub_name_without_a_network_becomes_an_offline_llama_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name, note = models.resolve_model("HuggingFaceTB/SmolLM2-135M", tmp_path, "llama-tiny")
    assert name == str(tmp_path / "offline-llama-tiny") and "\n" not in note
    assert "offline llama-shaped model (llama-tiny)" in note.lower() and "cannot be reached" in note


def test_bench_command_line_accepts_every_registry_shape(monkeypatch, capsys):
    seen = []

    def measure(spec, log_path=None):
        seen.append(spec)
        return runner.RunResult(label="fake", status=runner.OK, steps_done=1, losses=[1.0])

    monkeypatch.setattr(runner, "measure", measure)
    assert cli.bench_command(["--shape", "smollm2-135m-shaped", "--steps", "1", "--precision", "fp32"]) == 0
    assert seen[0].shape == "smollm2-135m-shaped" and seen[0].vocab_size is None
    with pytest.raises(SystemExit):
        cli.bench_command(["--shape", "llama-9000"])
    err = capsys.readouterr().err
    assert "--shape 'llama-9000'" in err and "qwen2.5-0.5b-shaped" in err and "tiny, mini, gpt2-124m" in err


def test_bench_trains_llama_tiny_at_stage_3_on_the_cpu():
    ds = config.build(stage=3, trainer=False, precision="fp32", pin_memory=False, micro_batch=2)
    result = runner.measure(runner.RunSpec(ds_config=ds, shape="llama-tiny", steps=3, force_cpu=True))
    assert result.status == runner.OK, result.message
    assert result.n_params == memory.ModelInfo.for_shape("llama-tiny").n_params
    assert abs(result.losses[0] - math.log(1024)) < 0.3, result.losses
    assert claims.loss_falls(result.losses), result.losses


def test_a_hub_name_in_the_local_cache_loads_offline_and_a_missing_absolute_path_is_refused(
        tmp_path, monkeypatch):
    """The Hub-name path without a network: a cache laid out as the Hub's, HF_HUB_OFFLINE=1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = models.save_offline_model(tmp_path / "saved", "tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert not models.hub_cached("zero-kit-offline/tiny-gpt2")
    name, note = models.resolve_model("zero-kit-offline/tiny-gpt2", tmp_path / "work", "tiny")
    assert name != "zero-kit-offline/tiny-gpt2" and "cannot be reached" in note  # not cached yet
    models.write_hub_cache(saved, "zero-kit-offline/tiny-gpt2", tmp_path / "hub")
    name, note = models.resolve_model("zero-kit-offline/tiny-gpt2", tmp_path / "work", "tiny")
    assert name == "zero-kit-offline/tiny-gpt2" and "cache" in note
    # this process imported huggingface_hub before HF_HUB_CACHE was set: name the cache here
    model = AutoModelForCausalLM.from_pretrained(name, cache_dir=tmp_path / "hub")
    tokenizer = AutoTokenizer.from_pretrained(name, cache_dir=tmp_path / "hub")
    assert model.config.vocab_size == len(tokenizer) and model.num_parameters() > 0
    with pytest.raises(FileNotFoundError, match="absolute path with no folder"):
        models.resolve_model(str(tmp_path / "nowhere"), tmp_path / "work", "tiny")


def test_a_pretrained_stand_in_starts_below_ln_vocab_and_keeps_the_real_vocabulary(tmp_path):
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from helpers import data

    folder = models.save_offline_model(tmp_path / "pre", "llama-tiny", pretrain_steps=60)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = models.offline_tokenizer()
    ids = data.batches(data.offline_corpus(20_000, seed=5), tokenizer, 64, 4, 1)[0]
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < math.log(model.config.vocab_size) - 1.0, loss
    seen = []

    class Built(Exception):
        pass

    def build(config, seed=0):
        seen.append(config.vocab_size)
        raise Built  # the vocabulary is all this test needs; a 0.5B model is not built

    for keep in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(models, "build_model", build)
            with pytest.raises(Built):
                models.save_offline_model(tmp_path / f"q{keep}", "qwen2.5-0.5b-shaped", keep_vocab=keep)
    # the checkpoint's own vocabulary, or the offline tokenizer's
    assert seen == [151936, len(models.offline_tokenizer())]


def test_a_pretrained_stand_in_is_written_once_per_machine_and_rewritten_when_its_recipe_changes(
        tmp_path, monkeypatch):
    """Notebook 06's smoke stand-in (minutes of pretraining on 2 cores) comes from the kit's cache
    the second time; another step count is another folder; a run that loses the race to write
    it reads the winner's copy and leaves no scratch folder behind."""
    written = []

    def fake_save(folder, shape, seed, keep_vocab, pretrain_steps):
        written.append((shape, pretrain_steps))
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")

    monkeypatch.setenv("ZERO_KIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_save_in_a_subprocess", fake_save)
    first, note = models.resolve_model(None, tmp_path / "a", "llama-mini", pretrain_steps=100)
    again, _ = models.resolve_model(None, tmp_path / "b", "llama-mini", pretrain_steps=100)
    assert first == again and written == [("llama-mini", 100)]
    assert first.startswith(str(tmp_path / "cache" / "models")) and "pretrained here" in note
    other, _ = models.resolve_model(None, tmp_path / "a", "llama-mini", pretrain_steps=50)
    assert other != first and len(written) == 2
    fresh, _ = models.resolve_model(None, tmp_path / "a", "llama-mini")  # not pretrained: not cached
    assert fresh == str(tmp_path / "a" / "offline-llama-mini")
    # the race: the folder appears while this run writes its own copy
    target = Path(helpers.kit_cache_dir(), "models", models.stand_in_key("llama-mini", 1, False, 100))

    def racing_save(folder, *args):
        fake_save(folder, *args)
        fake_save(target, *args)

    monkeypatch.setattr(models, "_save_in_a_subprocess", racing_save)
    assert models.resolve_model(None, tmp_path, "llama-mini", seed=1, pretrain_steps=100)[0] == str(target)
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".") and p.is_dir()] == []


def test_a_second_run_waits_for_the_first_writer_of_a_stand_in_and_does_not_pretrain_again(
        tmp_path, monkeypatch):
    """Two runs side by side (nbval's two workers: notebook 06 and its no-libaio twin) pretrain
    the stand-in once: the second waits on the lock, then reads the first's folder."""
    import threading
    import time

    written, started = [], threading.Event()

    def slow_save(folder, shape, seed, keep_vocab, pretrain_steps):
        started.set()
        time.sleep(1.0)
        written.append(shape)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")

    monkeypatch.setenv("ZERO_KIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_save_in_a_subprocess", slow_save)
    found = []
    first = threading.Thread(target=lambda: found.append(
        models.resolve_model(None, tmp_path, "llama-mini", pretrain_steps=100)[0]))
    first.start()
    started.wait(10)
    found.append(models.resolve_model(None, tmp_path, "llama-mini", pretrain_steps=100)[0])
    first.join(10)
    assert written == ["llama-mini"] and len(found) == 2 and found[0] == found[1]


def test_a_run_with_the_embedding_frozen_trains_everything_else_and_learns():
    """The 3B lever on the CPU: the tied embedding (and so the head) frozen, the rest trained at
    ZeRO-3; a run that froze nothing, or everything, fails the count."""
    ds = config.build(stage=3, trainer=False, precision="fp32", pin_memory=False, micro_batch=2, lr=1e-2)
    spec = runner.RunSpec(ds_config=ds, shape="llama-tiny", steps=4, force_cpu=True, freeze_embeddings=True)
    result = runner.measure(spec)
    info = memory.ModelInfo.for_shape("llama-tiny")
    assert result.status == runner.OK, result.message
    assert result.n_trainable == info.n_params - memory.embedding_numel(info) > 0
    assert claims.loss_falls(result.losses), result.losses


def test_freezing_the_embedding_freezes_a_tied_head_with_it():
    model = models.build_model(models.model_config("llama-tiny"))
    frozen = taught.freeze_input_embedding(model)  # notebook 06's lesson function
    assert frozen == model.get_input_embeddings().weight.numel()
    assert not model.get_output_embeddings().weight.requires_grad
    assert all(p.requires_grad for n, p in model.named_parameters() if "embed" not in n)
