"""What ZeRO partitions, drawn before anything trains: for one model and N ranks, the bytes each
GPU holds of parameters, gradients and optimizer states under stages 0-3, and what offload moves
to host RAM or NVMe. The numbers come from the kit's own estimator (helpers.memory.estimate),
model states only (activations are the same for every stage and are left out here).
"""

from __future__ import annotations

from helpers import config, memory
from helpers.show import Table, GiB

KINDS = ("params", "grads", "optimizer")


def model_states(model: memory.ModelInfo, world_size: int) -> dict[str, dict[str, dict[str, int]]]:
    """{config: {place: {kind: bytes}}} for parameters, gradients and optimizer states per rank."""
    out = {}
    for label, choice in config.STAGE_ROWS:
        ds = config.for_row(choice, model, None, 1, world_size, precision="fp16", pin_memory=False,
                               nvme_path="/tmp/zero_kit_offload")
        est = memory.estimate(model, ds, world_size=world_size, micro_batch=1, seq_len=1, grad_ckpt=True,
                              zero_init=choice["stage"] == 3)
        out[label] = {place: {k: est.parts.get(place, {}).get(k, 0) for k in KINDS}
                      for place in ("gpu", "cpu", "nvme")}
    return out


def table(model: memory.ModelInfo, world_size: int) -> Table:
    """Bytes per parameter each rank keeps on its GPU, and what goes to host RAM and NVMe."""
    rows = []
    for label, places in model_states(model, world_size).items():
        per = lambda place: sum(places[place].values()) / model.n_params
        rows.append((label, *(f"{places['gpu'][k] / model.n_params:.1f}" for k in KINDS), f"{per('gpu'):.1f}",
                     f"{per('gpu') * model.n_params / GiB:.2f}", f"{per('cpu'):.1f}", f"{per('nvme'):.1f}"))
    return Table(["config", "params B/param", "grads B/param", "optimizer B/param", "GPU B/param",
                  "GPU GiB per rank", "host B/param", "NVMe B/param"], rows,
                 title=f"Model states of {model.name or 'this model'} ({model.n_params / 1e6:,.0f}M parameters) "
                       f"per rank, {world_size} ranks, mixed precision")


def figure(model: memory.ModelInfo, world_size: int):
    """Stacked bars: per rank on the GPU (parameters, gradients, optimizer states), and off it."""
    import matplotlib.pyplot as plt

    states = model_states(model, world_size)
    labels = list(states)
    fig, (gpu_ax, off_ax) = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    colours = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}
    for ax, places, title in ((gpu_ax, ("gpu",), f"on each GPU ({world_size} ranks)"),
                              (off_ax, ("cpu", "nvme"), "moved off the GPU (host RAM + NVMe)")):
        left = [0.0] * len(labels)
        for kind in KINDS:
            widths = [sum(states[c][p][kind] for p in places) / GiB for c in labels]
            ax.barh(labels, widths, left=left, color=colours[kind], label=kind)
            left = [a + b for a, b in zip(left, widths)]
        for i, total in enumerate(left):
            ax.text(total, i, f" {total:.2f} GiB ({total * GiB / model.n_params:.1f} B/param)", va="center",
                    fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("GiB")
        ax.set_xlim(0, max(max(left) * 1.6, 0.01))
    gpu_ax.invert_yaxis()
    gpu_ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"What ZeRO partitions: {model.name or 'the model'}, {model.n_params / 1e6:,.0f}M parameters, "
                 "fp16 weights + fp32 Adam (16 bytes per parameter in all)")
    fig.tight_layout()
    return fig
