"""The lesson code the kit's own runs call, generated from the notebooks: every function a
cell tagged "export" defines, as the cell writes it, headed by its notebook and cell. Do not edit:
edit the notebook's cell, then run  python tools/nbtool.py export  (tests/test_taught.py fails
while this file and the notebooks differ). Each cell's imports come along; nothing else of it runs.
"""


# ---- notebooks/05_stages_and_offload.ipynb, cell 8 -----------------------------------------------
import copy

def stage0_config(micro_batch, precision):
    """Plain data parallelism, no ZeRO: the config every row of the matrix starts from."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupLR",  # from a tenth of the rate up to it over 10 steps
                      "params": {"warmup_min_lr": 3e-5, "warmup_max_lr": 3e-4,
                                 "warmup_num_steps": 10, "warmup_type": "linear"}},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 12},
        "bf16": {"enabled": precision == "bf16"},
        "zero_optimization": {"stage": 0},
    }


def zero_rows(offload_dir):
    """The "zero_optimization" block of each row (NVMe offload keeps its files in offload_dir)."""
    return {
        "stage 0": {"stage": 0},
        "stage 1": {"stage": 1},  # optimizer states partitioned across the GPUs
        "stage 2": {"stage": 2},  # ... and the gradients
        "stage 3": {"stage": 3},  # ... and the weights
        "stage 2 + CPU offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "stage 3 + CPU offload": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                  "offload_param": {"device": "cpu"}},  # the weights in RAM too
        "stage 3 + NVMe offload": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": offload_dir},
            "offload_param": {"device": "nvme", "nvme_path": offload_dir},
        },
    }


def row_config(base, zero):
    """``base`` with a row's "zero_optimization" block in place of its own."""
    config = copy.deepcopy(base)
    config["zero_optimization"] = copy.deepcopy(zero)
    return config


# ---- notebooks/06_biggest_model_on_a_t4.ipynb, cell 10 -------------------------------------------
def zero_infinity_config(n_params, largest, micro_batch, grad_accum, lr, warmup_steps, precision,
                         offload="nvme", offload_params=False, nvme_path=None, pin_memory=False,
                         world_size=1, largest_trained=None):
    """ZeRO-3 with the optimizer's states (fp32 weights and Adam's moments, 12 bytes per
    parameter) on ``offload`` ("nvme" or "cpu"), and the fp16 weights there too with
    ``offload_params`` (else they stay on the GPU: 2 bytes per parameter, no weight traffic).
    ``n_params`` and ``largest`` (the elements of the largest tensor) size the buffers; the
    optimizer's sub-groups close at ``largest_trained`` elements at most (with the embedding
    frozen, the largest tensor that trains; None: every tensor trains)."""
    place = {"device": offload,
             "pin_memory": pin_memory}  # page-locked buffers: faster, but they cost host RAM
    if offload == "nvme":
        place["nvme_path"] = str(nvme_path)  # a fast local disk, ~18 bytes per parameter free
    optimizer_offload = {**place, **({"buffer_count": 4} if offload == "nvme" else {})}
    param_offload = {"device": "none"}
    if offload_params:
        param_offload = dict(place)
        if offload == "nvme":
            param_offload.update(buffer_count=5,  # swap buffers for the weights in flight
                                 buffer_size=int(1.05 * largest),  # each holds the largest tensor
                                 max_in_cpu=0)  # no weights kept in RAM besides them
    weights_on_nvme = param_offload["device"] == "nvme"
    config = {
        "train_batch_size": micro_batch * grad_accum * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,  # a step averages grad_accum micro-batches
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupLR",  # from a tenth of lr (a first step at 0 is wasted)
                      "params": {"warmup_min_lr": lr / 10, "warmup_max_lr": lr,
                                 "warmup_num_steps": warmup_steps, "warmup_type": "linear"}},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0,  # 0: dynamic loss scaling
                 "initial_scale_power": 12,  # 2**12: DeepSpeed's 2**16 overflows at first
                 "loss_scale_window": 100, "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": precision == "bf16"},
        "zero_optimization": {
            "stage": 3,
            "offload_param": param_offload,
            "offload_optimizer": optimizer_offload,
            # the optimizer steps its states a sub-group at a time, each swapped through 4 fp32
            # buffers as large as the largest group; a group closes once it reaches this size and
            # a tensor is never split, so the largest tensor (the embedding) is a group of its own
            # and a 32nd of the model keeps the other groups smaller than it
            "sub_group_size": min(100_000_000, max(1_000_000, n_params // 32),
                                  largest_trained or n_params),
            "stage3_max_live_parameters": 100_000_000,
            # with the weights on NVMe, a weight kept for reuse keeps its swap buffer: keep none
            "stage3_max_reuse_distance": 0 if weights_on_nvme else 100_000_000,
            # 0 with weights on NVMe: DeepSpeed 0.19 prefetches into every free swap buffer and
            # can leave none for a weight it did not foresee ("Not enough buffers 0 for swapping 1")
            "stage3_prefetch_bucket_size": 0 if weights_on_nvme else 20_000_000,
            "stage3_param_persistence_threshold": 100_000,  # tensors this small stay on the GPU
            "reduce_bucket_size": 20_000_000,
            "overlap_comm": world_size > 1,  # reduction beside backward: it pays on several GPUs
            "contiguous_gradients": True,
            "stage3_gather_16bit_weights_on_model_save": True,  # save_16bit_model gathers weights
        },
        "steps_per_print": 1000000000,
        "wall_clock_breakdown": False,
    }
    if offload == "nvme":  # how DeepSpeed reads and writes the disk (libaio)
        config["aio"] = {"block_size": 1048576, "queue_depth": 16, "single_submit": False,
                         "overlap_events": True, "intra_op_parallelism": 2}
    return config


# ---- notebooks/06_biggest_model_on_a_t4.ipynb, cell 12 -------------------------------------------
def freeze_input_embedding(model):
    """Freeze ``model``'s input embedding (and a head tied to it); returns the elements frozen."""
    weight = model.get_input_embeddings().weight
    weight.requires_grad_(False)  # no gradient: no fp16 gradient buffer, no optimizer state
    return getattr(weight, "ds_numel", weight.numel())


# ---- notebooks/06_biggest_model_on_a_t4.ipynb, cell 20 -------------------------------------------
def save_16bit_in_shards(engine, folder, shard_bytes=1_000_000_000):
    """The weights (and persistent buffers) of ``engine`` as safetensors shards in ``folder``,
    with the model.safetensors.index.json that from_pretrained reads; returns the shard files.
    Under ZeRO-3 pass the DeepSpeed engine (not engine.module): it settles its weights first."""
    import json
    import os

    import deepspeed
    import torch.distributed as dist
    from safetensors.torch import save_file

    model = getattr(engine, "module", engine)
    if hasattr(engine, "empty_partition_cache"):
        # ZeRO-3 fetches the next weights ahead during a forward: after an evaluation some are
        # still in flight, and gathering one fails ("Cannot partition a param in flight")
        engine.empty_partition_cache()
    writes = not dist.is_initialized() or dist.get_rank() == 0
    os.makedirs(folder, exist_ok=True)
    weight_map, files, shard, names, size, total = {}, [], {}, [], 0, 0

    def flush():
        name = f"model-{len(files) + 1:05d}.safetensors"
        if writes:
            save_file(shard, os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, name))
        files.append(name)
        shard.clear()
        names.clear()

    persistent = model.state_dict().keys()  # buffers a checkpoint keeps (not rotary caches)
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers()
                                            if n in persistent)]
    for name, tensor in tensors:  # a tied head is the embedding's tensor: listed once
        with deepspeed.zero.GatheredParameters([tensor] if hasattr(tensor, "ds_id") else []):
            nbytes = tensor.numel() * tensor.element_size()  # the whole tensor, while gathered
            if writes:
                shard[name] = tensor.detach().to("cpu", copy=True)
        names.append(name)
        size, total = size + nbytes, total + nbytes
        if size >= shard_bytes:  # a shard closes once it reaches shard_bytes
            flush()
            size = 0
    if names:
        flush()
    if writes:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    if dist.is_initialized():
        dist.barrier()  # every rank returns once the folder is whole
    return files


# ---- notebooks/06_biggest_model_on_a_t4.ipynb, cell 27 -------------------------------------------
def reload_saved(folder, dtype, device):
    """The saved ``folder`` as a Hugging Face model on ``device``, in evaluation mode. device_map
    sends each shard straight to its device (no whole copy of the model in host RAM first)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=device,
                                                use_kernels=False).eval()


# ---- notebooks/07_engine_and_accelerate.ipynb, cell 16 -------------------------------------------
def train_step(engine, batch):
    """One optimizer step through DeepSpeed's engine; returns the batch's loss. The kit's own
    measured runs (notebooks 05, 06, 09, python -m helpers bench) call this same function."""
    loss = engine(**batch).loss  # the batch carries its labels
    engine.backward(loss)  # fp16 loss scaling; gradients reduced into ZeRO's partitions
    engine.step()  # the optimizer and the scheduler; the gradients zeroed
    return loss.item()
