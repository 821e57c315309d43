"""Notebook 06's save_16bit_in_shards (helpers.taught, exported from its lesson cell): shards a
from_pretrained reload reads back whole, none larger than asked (plus one tensor), a tied head
written once. Under ZeRO-3 the lesson script test (tests/test_lesson_scripts.py) saves and reloads
it with equal logits."""

import json

import torch
from transformers import AutoModelForCausalLM

from helpers import models, taught


def _model():
    torch.manual_seed(0)
    return models.build_model(models.model_config("llama-tiny"))


def test_the_shards_reload_to_the_same_weights_with_a_tied_head_written_once(tmp_path):
    model = _model()
    files = taught.save_16bit_in_shards(model, tmp_path, shard_bytes=200_000)
    model.config.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == sorted(files)
    assert all((tmp_path / f).is_file() for f in files)
    names = dict(model.named_parameters())
    assert set(index["weight_map"]) == set(names)  # no rotary cache; the tied head once
    assert index["metadata"]["total_size"] == sum(p.numel() * p.element_size() for p in names.values())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    ids = torch.tensor([[1, 5, 9, 13]])
    assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_each_shard_holds_at_most_its_size_and_one_tensor_more(tmp_path, monkeypatch):
    import safetensors.torch

    written = []
    real = safetensors.torch.save_file
    monkeypatch.setattr(safetensors.torch, "save_file", lambda tensors, path, metadata=None: (
        written.append(sum(t.numel() * t.element_size() for t in tensors.values())),
        real(tensors, path, metadata=metadata)))
    model = _model()
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    taught.save_16bit_in_shards(model, tmp_path, shard_bytes=100_000)
    assert len(written) > 3 and max(written) < 100_000 + largest
    one = tmp_path / "one"
    taught.save_16bit_in_shards(model, one)  # the default, 1 GB: one shard for a tiny model
    assert len(written) == len(list(tmp_path.glob("model-*.safetensors"))) + 1


def _save_on_rank(rank: int, port: int, root: str, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:  # each rank its own folder, to see which one writes
        files = taught.save_16bit_in_shards(_model(), f"{root}/rank{rank}", shard_bytes=200_000)
        out.put((rank, files))
    finally:
        dist.destroy_process_group()


def test_on_two_ranks_rank_0_writes_and_both_agree_on_the_shards(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_save_on_rank, args=(port, str(tmp_path), out), nprocs=2, start_method="spawn")
    files = dict(out.get(timeout=60) for _ in range(2))
    assert files[0] == files[1] and len(files[0]) > 2
    assert sorted(p.name for p in (tmp_path / "rank0").glob("model-*")) == files[0]
    assert not list((tmp_path / "rank1").iterdir())  # made, never written into


def test_an_engine_settles_the_weights_it_fetched_ahead_before_the_first_gather(tmp_path, monkeypatch):
    """Given a DeepSpeed engine, the save empties its partition cache before gathering anything:
    on a GPU, ZeRO-3 fetches weights ahead during a forward, and after an evaluation a gather of
    one still in flight failed ("Cannot partition a param in flight"). Its module is saved."""
    import deepspeed

    calls = []

    class Engine:
        module = _model()

        def empty_partition_cache(self):
            calls.append("settle")

    real = deepspeed.zero.GatheredParameters
    monkeypatch.setattr(deepspeed.zero, "GatheredParameters",
                        lambda params: (calls.append("gather"), real(params))[1])
    taught.save_16bit_in_shards(Engine(), tmp_path)
    assert calls[0] == "settle" and calls.count("settle") == 1 and calls.count("gather") > 1
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(dict(Engine.module.named_parameters()))
