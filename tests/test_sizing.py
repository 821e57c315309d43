"""helpers.sizing: any model sized per stage and offload with the verdict (kit shapes, a local
save_pretrained folder, a Hub name offline), beside DeepSpeed's and Accelerate's estimators."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli, config, memory, models, sizing
from helpers import env as kit_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def t4():
    return config.t4_profile(kit_env.describe())


@pytest.mark.parametrize("shape", list(models.MODEL_SHAPES))
def test_every_kit_shape_is_sized_per_stage_and_offload(shape, t4):
    info, _ = sizing.resolve(shape)
    rows = sizing.size(info, t4, micro_batch=2, seq_len=256, grad_ckpt=True)
    labels = ([label for label, _ in sizing.config.STAGE_ROWS]
              + [sizing.ZERO_INIT_NVME, sizing.ZERO_INIT_NVME_OPTIMIZER])
    assert [r.label for r in rows] == labels
    assert all(r.estimate.total("gpu") > 0 and r.estimate.total("cpu") > 0 for r in rows)
    assert all(r.overall in (memory.FITS, memory.TIGHT, memory.NO_FIT) for r in rows)
    assert rows[-1].estimate.total("nvme") > 0 and "nvme" in rows[-1].verdicts


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as done:
        cli.sizing_command(argv)
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_hub_name_offline_is_refused_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    err = _refused(capsys, ["--model", "meta-llama/Llama-3.2-1B", "--micro-batch", "1"])
    assert (
        err.startswith("sizing: --model 'meta-llama/Llama-3.2-1B': not a kit shape")
        and "cannot be reached" in err
    )


def test_bad_options_and_a_folder_without_a_config_are_refused(capsys, tmp_path):
    assert "without config.json" in _refused(capsys, ["--model", str(tmp_path)])
    assert "--micro-batch 0" in _refused(capsys, ["--model", "tiny", "--micro-batch", "0"])
    assert "--emulate 'a100'" in _refused(capsys, ["--model", "tiny", "--emulate", "a100"])


def test_the_command_line_sizes_a_save_pretrained_folder_offline(tmp_path):
    folder = models.save_offline_model(tmp_path / "model", "llama-tiny")
    child = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "helpers",
            "sizing",
            "--model",
            str(folder),
            "--micro-batch",
            "2",
            "--seq-len",
            "64",
            "--grad-ckpt",
            "--emulate",
            "t4",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    cap = kit_env.EMULATIONS["t4"].gpu_cap_bytes / 2**30
    assert lines[0].startswith(f"{folder}: ") and f"GPU {cap:.1f} GiB" in lines[0]
    rows = len(sizing.config.STAGE_ROWS) + 2  # and the two zero.Init rows
    assert sum(line.startswith("stage ") for line in lines) == rows and "verdicts for:" in lines[-1]


def test_side_by_side_puts_each_estimator_where_it_has_a_figure(t4):
    info, hf = sizing.resolve("gpt2-355m")
    table = sizing.side_by_side(info, hf, t4, 4, 512, grad_ckpt=True)
    rows = {r[0]: dict(zip(table.header, r)) for r in table.rows}
    assert rows["stage 0"]["measured GPU"] == "8.00" and rows["stage 0"]["DeepSpeed GPU"] == "-"
    assert rows["stage 2"]["DeepSpeed GPU"] != "-" and rows["stage 2"]["Accelerate GPU"] == "-"
    assert (
        rows["stage 0"]["Accelerate GPU"] != "-"
        and rows["stage 3 + NVMe offload"]["DeepSpeed GPU"] == "-"
    )
    # DeepSpeed's ZeRO-2 formula, 2 + 18 bytes per parameter on one GPU: called with the right count
    assert sizing.deepspeed_estimates(info)["stage 2"][0] == 2 * info.n_params + 18 * info.n_params


def test_the_zero_init_row_agrees_with_notebook_06s_27b_run(t4):
    # Notebook 06 trained GPT-2 2.7B with ZeRO-3 + NVMe under zero.Init in 11.24 GiB of host RSS
    # (docs/gpu_runs.md run 14): the command line predicts that within 5%, and so calls it "does not
    # fit" a run's share of free Colab (12.7 GB less the VM's 1.2 and the kernel's own RSS), as
    # it does the same model built on the host first (4 bytes per parameter before partitioning).
    info, _ = sizing.resolve("gpt2-2.7b")
    rows = {r.label: r for r in sizing.size(info, t4, micro_batch=4, seq_len=512)}
    inited, built = rows[sizing.ZERO_INIT_NVME], rows["stage 3 + NVMe offload"]
    assert inited.verdicts["cpu"].word == memory.NO_FIT
    assert inited.verdicts["cpu"].limit < 11 * 10**9
    assert built.verdicts["cpu"].word == memory.NO_FIT
    assert inited.config["zero_optimization"]["offload_param"]["device"] == "nvme"
    assert abs(inited.estimate.total("cpu") / (11.24 * 2**30) - 1) < 0.05


#: Llama-3.2-3B-shaped in T4 emulation, ZeRO-3 with the optimizer on NVMe and the weights on the
#: GPU under zero.Init, the input embedding frozen, 4 x 512 with checkpointing (docs/gpu_runs.md run
#: 34), by optimizer sub-group size: peak GPU allocated, peak host RSS, NVMe bytes.
LLAMA_3B_FROZEN_MEASURED = {
    100_000_000: {"gpu": 10_087_575_552, "cpu": 10_332_422_144, "nvme": 45_100_044_288},
    50_000_000: {"gpu": 10_087_575_552, "cpu": 9_055_715_328, "nvme": 45_100_318_720},
}


@pytest.mark.parametrize("sub_group", list(LLAMA_3B_FROZEN_MEASURED))
def test_the_3b_llama_with_its_embedding_frozen_is_predicted_as_measured(t4, sub_group):
    # The weights-on-GPU row's config with run 34's sub-groups: the estimator with the embedding
    # frozen within 10% on GPU and 15% on host RAM and NVMe of what trained; trained whole, past
    # a run's RAM on free Colab by half again.
    info, _ = sizing.resolve("llama-3.2-3b-shaped")
    row = {r.label: r for r in sizing.size(info, t4, 4, 512, grad_ckpt=True)}[
        sizing.ZERO_INIT_NVME_OPTIMIZER]
    ds = json.loads(json.dumps(row.config))
    ds["zero_optimization"]["sub_group_size"] = sub_group
    measured = LLAMA_3B_FROZEN_MEASURED[sub_group]

    def estimate(frozen):
        return memory.estimate(info, ds, seq_len=512, grad_ckpt=True, zero_init=True,
                               frozen_embeddings=frozen)

    frozen, whole = estimate(True), estimate(False)
    for place, tolerance in (("gpu", 0.10), ("cpu", 0.15), ("nvme", 0.15)):
        ratio = frozen.total(place) / measured[place]
        assert abs(ratio - 1) < tolerance, (place, ratio)
    assert whole.total("cpu") / measured["cpu"] > 1.5
    assert row.verdicts["cpu"].word == memory.NO_FIT  # the row itself: trained whole


def test_the_3b_run_that_saved_is_predicted_with_its_save_as_the_host_peak(t4):
    # docs/gpu_runs.md run 35: 06's lesson sub-groups (the largest trained tensor, 25.2M), 5 steps,
    # then the 16-bit save in 1 GB shards: host 8.59 GiB at the save (7.79 in the optimizer step),
    # GPU 9.39 GiB. Predicted with the save: within 15% on host RAM, the save its peak; without
    # it the step's figure is below what the run reached.
    info, _ = sizing.resolve("llama-3.2-3b-shaped")
    row = {r.label: r for r in sizing.size(info, t4, 4, 512, grad_ckpt=True, frozen_embeddings=True)}[
        sizing.ZERO_INIT_NVME_OPTIMIZER]
    measured = {"gpu": 10_087_575_552, "cpu": 9_222_492_160, "step": 8_368_902_144}

    def estimate(shard):
        return memory.estimate(info, row.config, seq_len=512, grad_ckpt=True, zero_init=True,
                               frozen_embeddings=True, save_shard_bytes=shard)

    saving, training = estimate(memory.SAVE_SHARD_BYTES), estimate(0)
    assert saving.phase["cpu"] == "save in shards" and training.phase["cpu"] == "optimizer step"
    assert abs(saving.total("cpu") / measured["cpu"] - 1) < 0.15
    assert abs(training.total("cpu") / measured["step"] - 1) < 0.05 < 1 - training.total("cpu") / measured["cpu"]
    assert abs(saving.total("gpu") / measured["gpu"] - 1) < 0.10
    assert saving.total("cpu") < t4.ram_budget_bytes  # still fits free Colab's run, as measured


def test_frozen_the_rows_size_sub_groups_to_the_largest_tensor_that_trains(t4):
    # as notebook 06's lesson does with FREEZE_EMBEDDING: the embedding (394M) is in no sub-group,
    # so they can be as small as an MLP matrix (3072 x 8192), and the 3B row then fits
    info, _ = sizing.resolve("llama-3.2-3b-shaped")
    rows = sizing.size(info, t4, 4, 512, grad_ckpt=True, frozen_embeddings=True)
    row = {r.label: r for r in rows}[sizing.ZERO_INIT_NVME_OPTIMIZER]
    assert row.config["zero_optimization"]["sub_group_size"] == 3072 * 8192
    assert row.config["zero_optimization"]["offload_param"]["device"] == "none"
    assert row.overall == memory.FITS
    assert row.estimate.total("cpu") < LLAMA_3B_FROZEN_MEASURED[50_000_000]["cpu"]


def test_the_command_line_freezes_the_embedding_when_asked(capsys):
    args = ["--model", "llama-3.2-3b-shaped", "--emulate", "t4", "--grad-ckpt"]
    assert cli.sizing_command(args) == 0
    trained_all = capsys.readouterr().out
    assert cli.sizing_command(args + ["--freeze-embeddings"]) == 0
    frozen = capsys.readouterr().out
    assert "embedding frozen (2,819M of them train)" in frozen
    assert "embedding frozen" not in trained_all

    def verdict(out):  # the row's overall verdict (columns are two or more spaces apart)
        line = next(x for x in out.splitlines() if x.startswith(sizing.ZERO_INIT_NVME_OPTIMIZER))
        return re.split(r"\s{2,}", line)[7]

    assert verdict(trained_all) == memory.NO_FIT
    assert verdict(frozen) in (memory.FITS, memory.TIGHT)


def test_the_other_estimators_are_not_compared_with_a_frozen_embedding(capsys):
    # DeepSpeed's and Accelerate's estimators know no frozen parameters: refused, not mislabelled
    err = _refused(capsys, ["--model", "tiny", "--freeze-embeddings", "--compare"])
    assert err.endswith("drop one") and "--compare" in err


def test_past_the_headline_a_3b_llama_does_not_fit_colabs_ram_and_the_readme_says_why(t4):
    # docs/deepspeed_gaps.md ("Past 2B"): the gradient partition on the host and swap buffers sized to the tied
    # embedding put Llama-3.2-3B-shaped past 12.7 GB even built under zero.Init.
    info, _ = sizing.resolve("llama-3.2-3b-shaped")
    rows = {r.label: r for r in sizing.size(info, t4, micro_batch=4, seq_len=512)}
    row = rows[sizing.ZERO_INIT_NVME]
    host = row.estimate.parts["cpu"]
    assert row.verdicts["cpu"].word == memory.NO_FIT
    assert host["grads"] == 2 * info.n_params and info.largest_param_numel == 128256 * 3072
    buffer = row.config["zero_optimization"]["offload_param"]["buffer_size"]
    assert buffer >= info.largest_param_numel and host["parameter swap buffers"] == 5 * buffer * 2
    readme = (ROOT / "docs/deepspeed_gaps.md").read_text().replace("\n  ", " ")
    figures = (row.estimate.total("cpu"), host["grads"], host["parameter swap buffers"],
               host["optimizer swap buffers"])
    for figure in figures:
        assert f"{figure / 2**30:.2f}" in readme, figure / 2**30


# ---- models nobody on the project wrote (issue 29): config.json with the published numbers ---

#: The architecture fields of published checkpoints' config.json (no weights, nothing downloaded).
PUBLISHED = {
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "vocab_size": 128256, "max_position_embeddings": 131072,
                     "rope_theta": 500000.0, "tie_word_embeddings": False,
                     "torch_dtype": "bfloat16"},
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0,
                   "torch_dtype": "bfloat16"},
    "pythia-160m": {"model_type": "gpt_neox", "hidden_size": 768, "intermediate_size": 3072,
                    "num_hidden_layers": 12, "num_attention_heads": 12, "vocab_size": 50304,
                    "max_position_embeddings": 2048, "rotary_pct": 0.25, "hidden_act": "gelu",
                    "use_parallel_residual": True, "tie_word_embeddings": False,
                    "torch_dtype": "float16"},
    "falcon-7b": {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
                  "num_attention_heads": 71, "vocab_size": 65024, "multi_query": True,
                  "new_decoder_architecture": False, "parallel_attn": True, "bias": False,
                  "alibi": False, "torch_dtype": "bfloat16"},
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                     "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "gemma-2-2b": {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
                   "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                   "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
                   "tie_word_embeddings": True, "torch_dtype": "float32"},
    "phi-3-mini": {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "vocab_size": 32064, "max_position_embeddings": 4096, "pad_token_id": 32000,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "vocab_size": 32000, "max_position_embeddings": 32768,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": 152064, "max_position_embeddings": 131072,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "t5-small": {"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_layers": 6,
                 "num_heads": 8, "vocab_size": 32128, "is_encoder_decoder": True},
    "bert-base": {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
                  "max_position_embeddings": 512},
}


def folder(tmp_path, name: str, data=None, text: str | None = None) -> str:
    """A model folder holding only a config.json: ``data`` as JSON, or ``text`` as it is."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(text if text is not None else json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(ModelInfo, config) of each causal LM of :data:`PUBLISHED`, resolved from its folder."""
    root = tmp_path_factory.mktemp("published")
    return {name: sizing.resolve(folder(root, name, data))
            for name, data in PUBLISHED.items() if name not in ("t5-small", "bert-base")}


#: (parameters the checkpoint has, k/v heads, width of one head, a gated MLP, RMSNorm)
COUNTED = {
    "llama-3.1-8b": (8_030_261_248, 8, 128, True, True),
    "qwen3-0.6b": (596_049_920, 8, 128, True, True),   # head_dim 128, not 1024 / 16
    "pythia-160m": (162_322_944, 12, 64, False, False),  # GELU MLP, LayerNorm
    "falcon-7b": (6_921_720_704, 1, 64, False, False),  # multi-query: one k/v head, not 71
    "mixtral-8x7b": (46_702_792_704, 8, 128, True, True),
    "gemma-2-2b": (2_614_341_888, 4, 256, True, True),
    "phi-3-mini": (3_821_079_552, 32, 96, True, True),   # fused gate_up_proj: still gated
    "mistral-7b": (7_241_732_096, 8, 128, True, True),
    "qwen2.5-7b": (7_615_616_512, 4, 128, True, True),
}


@pytest.mark.parametrize("name", list(COUNTED))
def test_published_models_are_counted_and_their_fields_read_per_family(name, published):
    info, _ = published[name]
    params, kv, head_dim, gated, rms = COUNTED[name]
    assert (info.n_params, info.kv_heads, info.head_dim) == (params, kv, head_dim)
    assert (info.gated_mlp, info.rms_norm) == (gated, rms)


def test_activations_follow_each_familys_own_fields(published):
    def layer(info, **changed):
        return memory.layer_activation_bytes(dataclasses.replace(info, **changed), 1024)

    qwen3, pythia, falcon = (published[n][0] for n in ("qwen3-0.6b", "pythia-160m", "falcon-7b"))
    # Qwen3's q is 16 x 128 = 2048 wide, twice its hidden size: read as Llama's it would be 1024
    assert layer(qwen3) > layer(qwen3, head_dim=qwen3.hidden // qwen3.heads)
    # a plain GELU MLP keeps two intermediate-wide tensors, SwiGLU four
    assert layer(pythia, gated_mlp=True) - layer(pythia) == 2 * 2 * pythia.intermediate * 1024
    # Falcon-7B's single k/v head: far fewer k/v bytes than 71 heads would keep
    assert layer(falcon) < layer(falcon, kv_heads=71)


def test_the_kit_shapes_keep_their_estimates():
    # the new fields default to what the kit's GPT-2 and Llama/Qwen shapes are
    for shape in models.MODEL_SHAPES:
        info, _ = sizing.resolve(shape)
        assert info.head_dim * info.heads == info.hidden
        assert info.gated_mlp == info.rms_norm == (models.shape_family(shape) != "gpt2")


BAD_MODELS = [  # (folder name, config.json text, words in the one-line refusal)
    ("broken", '{"model_type": "llama", "hidden_size": 4096,', "not valid JSON (line 1"),
    ("untyped", '{"hidden_size": 4096}', 'no "model_type"'),
    ("unknown", '{"model_type": "no-such-architecture"}', "transformers cannot read"),
    ("t5", json.dumps(PUBLISHED["t5-small"]), "t5 is an encoder-decoder model"),
    ("bert", json.dumps(PUBLISHED["bert-base"]), "bert is an encoder (a masked LM)"),
]

SMALL_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
               "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
               "vocab_size": 1000, "max_position_embeddings": 512}
# Malformed configs transformers 5 refuses inside AutoConfig (huggingface_hub's strict dataclass
# errors, a ZeroDivisionError) or builds a model of that cannot run: one line each, exit 2
BAD_MODELS += [(name, json.dumps({**SMALL_LLAMA, **change}), words) for name, change, words in [
    ("heads-do-not-divide-hidden", {"hidden_size": 250}, "hidden_size 250 is not a multiple"),
    ("string-layers", {"num_hidden_layers": "two"}, '"num_hidden_layers": "two", not a whole'),
    ("null-vocabulary", {"vocab_size": None}, '"vocab_size": null, not a whole number'),
    ("zero-heads", {"num_attention_heads": 0}, '"num_attention_heads": 0, not a whole number'),
    ("kv-heads-do-not-divide", {"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ("a-field-only-transformers-checks", {"max_position_embeddings": "long"},
     "Field 'max_position_embeddings' expected int"),
    ("remote-code", {"model_type": "my-arch", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}},
     "needs the model's own code (auto_map: configuration_my.MyConfig)"),
]] + [("mamba", json.dumps({"model_type": "mamba", "hidden_size": 256, "num_hidden_layers": 2,
                               "vocab_size": 1000, "state_size": 16}),
          "mamba has no attention heads")]


@pytest.mark.parametrize("name, text, words", BAD_MODELS, ids=[b[0] for b in BAD_MODELS])
def test_a_bad_model_folder_ends_in_one_line_naming_it_exit_2(name, text, words, tmp_path, capsys):
    err = _refused(capsys, ["--model", folder(tmp_path, name, text=text), "--emulate", "none"])
    assert words in err and err.startswith("sizing: --model ") and "Traceback" not in err


def test_bert_is_sized_as_a_causal_lm_only_when_its_config_says_is_decoder(tmp_path):
    decoder = {**PUBLISHED["bert-base"], "is_decoder": True}
    info, _ = sizing.resolve(folder(tmp_path, "bert", decoder))
    assert info.n_params > 100e6 and info.family == "bert"


def test_a_missing_path_is_named_a_missing_folder_not_an_unreachable_hub_name(capsys, tmp_path):
    for missing in (str(tmp_path / "no" / "such"), "./no-such-folder", "~/no-such-folder"):
        err = _refused(capsys, ["--model", missing])
        assert "no such folder" in err and "Hub" in err.split(":", 2)[2]
        assert "cannot be reached" not in err
    (tmp_path / "config.json").write_text("{}")
    assert "a file, not a folder" in _refused(capsys, ["--model", str(tmp_path / "config.json")])


def test_the_sequence_length_is_held_to_the_models_positions(capsys, tmp_path):
    pythia = folder(tmp_path, "pythia", PUBLISHED["pythia-160m"])
    err = _refused(capsys, ["--model", pythia, "--seq-len", "4096", "--emulate", "none"])
    assert "--seq-len 4096: past the model's 2,048 positions" in err and "2048 or less" in err
    assert "past" in _refused(capsys, ["--model", "gpt2-124m", "--seq-len", "2048"])
    info, _ = sizing.resolve(pythia)
    assert sizing.seq_len_problem(info, 2048) is None


def test_host_ram_adds_up_the_ranks_on_one_host(t4):
    info, _ = sizing.resolve("gpt2-124m")
    one = {r.label: r for r in sizing.size(info, t4, 2, 256, world_size=8)}
    # the T4 profile has one GPU: 8 ranks are 8 hosts, each with one rank's host RAM
    assert sizing.ranks_on_host(t4, 8) == 1
    assert all(r.needs["cpu"] == r.estimate.total("cpu") for r in one.values())
    kaggle = dataclasses.replace(t4, gpu_count=2)  # two T4s on one host
    two = {r.label: r for r in sizing.size(info, kaggle, 2, 256, world_size=8)}
    for label, row in two.items():
        assert row.needs["cpu"] == 2 * row.estimate.total("cpu")
        assert row.needs["gpu"] == row.estimate.total("gpu")
    assert "2 per host" in sizing.size_table(info, kaggle, 2, 256, world_size=8).title


def test_more_ranks_on_a_host_than_it_has_gpus_is_refused(capsys):
    err = _refused(capsys, ["--model", "tiny", "--world-size", "8", "--ranks-per-host", "4",
                            "--emulate", "t4"])
    assert "--ranks-per-host 4" in err and "use at most 1" in err and "8 hosts" in err
    err = _refused(capsys, ["--model", "tiny", "--world-size", "2", "--ranks-per-host", "4"])
    assert "more than --world-size 2" in err


def test_a_fused_moe_expert_tensor_is_gathered_whole(published, t4):
    # Mixtral's fused experts.gate_up_proj: 8 x (2 x 14336) x 4096 = 0.94B elements, 1.75 GiB in
    # fp16, gathered whole although the NVMe config caps live parameters far below it
    info, _ = published["mixtral-8x7b"]
    tensor = 8 * 2 * 14336 * 4096
    assert info.largest_param_numel == tensor
    row = {r.label: r for r in sizing.size(info, t4, 1, 512)}[sizing.ZERO_INIT_NVME]
    assert row.config["zero_optimization"]["stage3_max_live_parameters"] < tensor
    gathered = row.estimate.parts["gpu"]["gathered params"]
    assert gathered == 2 * tensor and f"{gathered / 2**30:.2f}" == "1.75"
    assert row.estimate.total("gpu") > gathered  # and the rest of the step beside it


def test_the_output_head_is_gathered_whole(published, t4):
    # Gemma-2-2B's 256,000 x 2304 head: 0.59B elements, 1.10 GiB in fp16
    info, _ = published["gemma-2-2b"]
    row = {r.label: r for r in sizing.size(info, t4, 1, 512)}[sizing.ZERO_INIT_NVME]
    assert row.estimate.parts["gpu"]["gathered params"] == 2 * 256_000 * 2304
    # a head larger than any one stored tensor (a vocabulary-sharded checkpoint): still whole
    sharded = dataclasses.replace(info, largest_param_numel=10**7)
    assert sharded.gathered_floor == 256_000 * 2304
    zero3 = {"fp16": {"enabled": True},
             "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 10**6,
                                   "stage3_prefetch_bucket_size": 10**6}}
    parts = memory.estimate(sharded, zero3, micro_batch=1, seq_len=512).parts["gpu"]
    assert parts["gathered params"] == 2 * 256_000 * 2304


def test_the_floors_leave_the_kit_shapes_default_stage_3_alone():
    info, _ = sizing.resolve("gpt2-355m")
    zero3 = {"fp16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    parts = memory.estimate(info, zero3).parts["gpu"]
    assert parts["gathered params"] == 2 * info.n_params  # live parameters (1e9) cover the model


def test_the_deepspeed_column_passes_the_largest_modules_parameters(published):
    info, _ = published["mixtral-8x7b"]
    # the experts module holds gate_up_proj and down_proj itself: 1.41B, more than either tensor
    assert info.largest_module_numel == 8 * 3 * 14336 * 4096 > info.largest_param_numel
    gpu, _ = sizing.deepspeed_estimates(info)["stage 3"]
    assert gpu == 4 * info.largest_module_numel + int(18 * info.n_params)


def test_accelerates_figure_does_not_depend_on_the_configs_dtype(tmp_path):
    import torch
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModelForCausalLM

    data = {k: v for k, v in models.model_config("llama-mini").to_dict().items() if k != "dtype"}
    figures = set()
    for dtype in ("float32", "bfloat16"):  # as a checkpoint's config.json says it
        _, hf = sizing.resolve(folder(tmp_path, dtype, {**data, "torch_dtype": dtype}))
        figures.add(sizing.accelerate_estimate(hf))
    assert len(figures) == 1 and hf.dtype == torch.bfloat16  # the caller's config left alone
    # what the figure would be from the bf16 model transformers 5 builds for a bf16 config: half
    with init_empty_weights():
        as_configured = AutoModelForCausalLM.from_config(hf)
    assert next(as_configured.parameters()).dtype == torch.bfloat16
    halved = max(estimate_training_usage(calculate_maximum_sizes(as_configured)[0],
                                         "float16").values())
    assert figures.pop() == pytest.approx(2 * halved, rel=1e-3)  # its own rounding aside


def test_compare_prints_deepspeeds_and_accelerates_estimates(capsys):
    assert cli.sizing_command(["--model", "gpt2-124m", "--micro-batch", "2", "--seq-len", "256",
                        "--compare", "--emulate", "none"]) == 0
    out = capsys.readouterr().out
    assert "DeepSpeed GPU" in out and "Accelerate GPU" in out and "four answers" in out


def test_a_malformed_field_reaches_transformers_refusal_whole_without_the_prefilter(monkeypatch, tmp_path):
    """What the kit's own field checks do not catch, transformers refuses: the cause inside its
    wrapper, in one line, never cut mid-word."""
    monkeypatch.setattr(sizing, "architecture_problem", lambda fields: None)
    with pytest.raises(sizing.SizingError) as refused:
        sizing.resolve(folder(tmp_path, "zero", {**SMALL_LLAMA, "num_attention_heads": 0}))
    assert "ZeroDivisionError" not in str(refused.value) or "division" in str(refused.value)
    with pytest.raises(sizing.SizingError) as refused:
        sizing.resolve(folder(tmp_path, "null", {**SMALL_LLAMA, "vocab_size": None}))
    assert "Field 'vocab_size' expected int, got NoneType" in str(refused.value)


def test_a_hub_name_with_custom_code_is_refused_without_a_prompt(monkeypatch):
    """transformers asks "run the custom code? [y/N]" at a terminal unless trust_remote_code is
    given: the sizer gives False, and says what to do."""
    import transformers

    asked = {}

    def from_pretrained(name, **kwargs):
        asked.update(kwargs)
        raise ValueError(f"The repository {name} contains custom code which must be executed to "
                         "correctly load the model. Please pass the argument `trust_remote_code=True`")

    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    with pytest.raises(sizing.SizingError) as refused:
        sizing.resolve("someone/custom-arch")
    assert asked.get("trust_remote_code") is False
    assert "runs no code from a model's folder or the Hub" in str(refused.value)


def test_the_table_prints_the_exact_parameter_count_beside_the_rounded_one(t4):
    info, _ = sizing.resolve("llama-3.2-3b-shaped")
    title = sizing.size_table(info, t4, 1, 512).title
    assert f"({info.n_params:,}, as a model card counts them)" in title


def test_under_t4_emulation_nvme_verdicts_use_a_colab_disk_not_this_machines(monkeypatch):
    from helpers import env as kit_env

    monkeypatch.setenv("KIT_EMULATE", "none")  # restored after the test
    machine = sizing.machine_for("t4")
    assert machine.disk_free_bytes == kit_env.EMULATIONS["t4"].disk_free_bytes
    assert "70 GB free for NVMe offload" in sizing.verdict_line(machine)


def test_a_save_holds_no_more_than_the_whole_model(t4):
    # a model far smaller than a shard: the save holds the model's own bytes, not a 1 GB shard
    info, _ = sizing.resolve("gpt2-124m")
    row = {r.label: r for r in sizing.size(info, t4, 4, 512)}[sizing.ZERO_INIT_NVME_OPTIMIZER]
    def host(shard):
        return memory.estimate(info, row.config, seq_len=512, zero_init=True,
                               save_shard_bytes=shard)

    training = host(0)
    kept = training.total("cpu") - training.parts["cpu"]["step temporaries"]
    assert 2 * info.n_params < memory.SAVE_SHARD_BYTES
    assert host(memory.SAVE_SHARD_BYTES).total("cpu") == max(training.total("cpu"),
                                                             kept + 2 * info.n_params)


def test_the_command_line_counts_the_save_in_shards_when_asked(capsys):
    # notebook 06's 16-bit save after training: the 3B's host peak is the save's (a shard and its
    # largest tensor over what training keeps), and the title says a save was counted
    args = ["--model", "llama-3.2-3b-shaped", "--emulate", "t4", "--grad-ckpt", "--freeze-embeddings"]

    def host(out):
        line = next(x for x in out.splitlines() if x.startswith(sizing.ZERO_INIT_NVME_OPTIMIZER))
        return float(re.split(r"\s{2,}", line)[2])

    assert cli.sizing_command(args) == 0
    trained = capsys.readouterr().out
    assert cli.sizing_command(args + ["--save-in-shards"]) == 0
    saved = capsys.readouterr().out
    assert "then a save in shards" in saved and "save in shards" not in trained
    assert host(saved) - host(trained) > memory.SAVE_SHARD_BYTES / 2**30
