"""Notebook 03, the config builder: its form (ipywidgets controls over helpers.config and
helpers.memory), the ten mistakes it shows caught, and its summary.

Every control change calls :meth:`ConfigForm.refresh`, which calls the same ``config.build``,
``config.check`` and ``memory.estimate`` that the plain cells and the tests call; the form only
shows their answers. Works with ipywidgets 7 (Colab) and 8 (JupyterLab): only basic widgets and
``observe(names="value")``.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

from helpers import config, memory, runner
from helpers import env as kit_env
from helpers.show import GiB, Table

MODEL_CHOICES = [("GPT-2 124M", "gpt2-124m"), ("GPT-2 355M", "gpt2-355m"), ("GPT-2 774M", "gpt2-774m"),
                 ("GPT-2 1.5B", "gpt2-1.5b"), ("SmolLM2-135M-shaped", "smollm2-135m-shaped"),
                 ("SmolLM2-360M-shaped", "smollm2-360m-shaped"), ("Qwen2.5-0.5B-shaped", "qwen2.5-0.5b-shaped"),
                 ("Llama-3.2-1B-shaped", "llama-3.2-1b-shaped"), ("TinyLlama-1.1B-shaped", "tinyllama-1.1b-shaped"),
                 ("tiny (smoke)", "tiny"), ("free parameter count", "custom")]


class ConfigForm:
    """Controls, a live JSON preview, a live problem list, live memory bars and a save button."""

    def __init__(self, environment: kit_env.Environment, shape: str = "gpt2-355m", micro_batch: int = 4,
                 seq_len: int = 512, folder: str | Path | None = None) -> None:
        import ipywidgets as w

        self.environment = environment
        self.folder = Path(folder) if folder else config.CONFIG_DIR
        self.t4 = kit_env.EMULATIONS["t4"]
        bf16_label = "bf16" if environment.native_bf16 else "bf16 (needs capability 8.0: not on this GPU)"
        self.controls = {
            "model": w.Dropdown(options=MODEL_CHOICES, value=shape, description="model"),
            "custom_params": w.IntText(value=1_000_000_000, description="parameters", disabled=True),
            "stage": w.Dropdown(options=[0, 1, 2, 3], value=2, description="ZeRO stage"),
            "offload_optimizer": w.Dropdown(options=list(config.OFFLOAD_DEVICES), value="none",
                                            description="offload optim."),
            "offload_param": w.Dropdown(options=list(config.OFFLOAD_DEVICES), value="none",
                                        description="offload params", disabled=True),
            "precision": w.Dropdown(options=[("auto", "auto"), ("fp16", "fp16"), (bf16_label, "bf16"), ("fp32", "fp32")],
                                    value="auto", description="precision"),
            "micro_batch": w.BoundedIntText(value=micro_batch, min=1, max=1024, description="micro batch"),
            "grad_accum": w.BoundedIntText(value=1, min=1, max=1024, description="grad. accum."),
            "seq_len": w.BoundedIntText(value=seq_len, min=8, max=8192, description="seq. length"),
            "lr": w.FloatText(value=3e-4, description="learning rate"),
            "grad_clip": w.FloatText(value=1.0, description="grad. clip"),
            "trainer": w.Checkbox(value=True, description='Trainer mode ("auto" values)'),
            "grad_ckpt": w.Checkbox(value=True, description="gradient checkpointing"),
            "nvme_path": w.Text(value=str(kit_env.default_offload_dir()), description="NVMe path"),
        }
        for control in self.controls.values():
            control.style.description_width = "120px"
            control.layout.width = "340px"
        self.reason = w.HTML()
        self.json_view = w.HTML()
        self.problems_view = w.HTML()
        self.bars = w.HTML()
        self.name = w.Text(value="my_config", description="file name")
        self.save_button = w.Button(description="save to configs/", button_style="primary")
        self.status = w.HTML()
        self.config: dict = {}
        self.problems: list[config.Problem] = []
        self.estimate: memory.Estimate | None = None
        self.error = ""
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        self.save_button.on_click(lambda _button: self.save())
        self.refresh()

    # -- logic (what the tests and nbval exercise) --------------------------------------------------------

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def set(self, **values) -> "ConfigForm":
        """Change controls as a user would (each change triggers refresh)."""
        for key, value in values.items():
            self.controls[key].value = value
        return self

    def model_info(self) -> memory.ModelInfo:
        v = self.values()
        if v["model"] == "custom":
            return memory.ModelInfo.from_count(int(v["custom_params"]), name="custom")
        return memory.ModelInfo.for_shape(v["model"])

    def refresh(self, _change=None) -> None:
        v = self.values()
        self.controls["custom_params"].disabled = v["model"] != "custom"
        stage3 = v["stage"] == 3
        self.controls["offload_param"].disabled = not stage3
        if not stage3 and v["offload_param"] != "none":
            self.controls["offload_param"].value = "none"  # re-enters refresh
            return
        self.reason.value = ("" if stage3 else "<i>Parameter offload needs stage 3: the control is disabled.</i>")
        self.error = ""
        try:
            info = self.model_info()
            self.config = config.build(
                stage=v["stage"], offload_optimizer=v["offload_optimizer"], offload_param=v["offload_param"],
                precision=v["precision"], micro_batch=v["micro_batch"], grad_accum=v["grad_accum"], lr=v["lr"],
                grad_clip=v["grad_clip"], trainer=v["trainer"], nvme_path=v["nvme_path"] or None,
                largest_param_numel=info.largest_param_numel, environment=self.environment)
            self.problems = config.check(self.config, hardware=self.environment, model=info, for_trainer=v["trainer"])
            engine_config = self.config if not v["trainer"] else config.for_engine(
                self.config, v["micro_batch"], v["grad_accum"], precision=self.environment.precision
                if v["precision"] == "auto" else v["precision"])
            self.estimate = memory.estimate(info, engine_config, micro_batch=v["micro_batch"], seq_len=v["seq_len"],
                                            grad_ckpt=v["grad_ckpt"], on_gpu=True)
        except (config.ConfigError, ValueError) as err:
            self.error = str(err)
            self.problems = [config.Problem("error", "form", str(err), "Correct the value above.")]
            self.estimate = None
        self._render()

    def limits(self) -> dict[str, int]:
        """Limits to draw: this GPU (or the emulated T4), the RAM budget, the free disk."""
        gpu = self.environment.vram_total_bytes or self.t4.gpu_cap_bytes
        return {"gpu": gpu, "cpu": self.environment.ram_budget_bytes, "nvme": self.environment.disk_free_bytes}

    def save(self) -> Path | None:
        """Write the config to configs/<name>.json unless it has errors; say what happened in the form."""
        errors = [p for p in self.problems if p.level == "error"]
        if errors:
            self.status.value = f"<span style='color:red'>not saved: {len(errors)} error(s) listed above</span>"
            return None
        try:
            path = config.save(self.config, self.name.value, self.folder)
        except config.ConfigError as err:
            self.status.value = f"<span style='color:red'>not saved: {html.escape(str(err))}</span>"
            return None
        self.status.value = f"saved <code>{html.escape(str(path))}</code>"
        return path

    # -- rendering ------------------------------------------------------------------------------------------

    def _render(self) -> None:
        self.json_view.value = f"<pre style='font-size:11px;max-height:320px;overflow:auto'>{html.escape(json.dumps(self.config, indent=2))}</pre>"
        if self.problems:
            items = "".join(f"<li><b style='color:{'red' if p.level == 'error' else 'darkorange'}'>{p.level}</b> "
                            f"<code>{html.escape(p.path)}</code>: {html.escape(p.message)} <i>Fix: {html.escape(p.fix)}</i></li>"
                            for p in self.problems)
            self.problems_view.value = f"<ul class='kit-problems'>{items}</ul>"
        else:
            self.problems_view.value = "<p class='kit-problems' style='color:green'>no problems found</p>"
        self.bars.value = self._bars_html()

    def _bars_html(self) -> str:
        if self.estimate is None:
            return "<p>no estimate: fix the error first</p>"
        rows = []
        needs = {p: self.estimate.total(p) for p in memory.PLACES}
        colours = {memory.FITS: "#2e7d32", memory.TIGHT: "#ef6c00", memory.NO_FIT: "#c62828"}
        for place, v in memory.verdicts(needs, self.limits()).items():
            frac = min(1.0, v.need / v.limit) if v.limit else 0
            bar = (f"<span style='display:block;width:{frac * 100:.0f}%;height:14px;"
                   f"background:{colours[v.word]}'></span>")
            rows.append(f"<div style='margin:2px 0'><span style='display:inline-block;width:80px'>"
                        f"{memory.PLACES[place]}</span><span style='display:inline-block;"
                        f"width:260px;background:#eee;vertical-align:middle'>{bar}</span> "
                        f"{html.escape(v.sentence().split(': ', 1)[1])}</div>")
        when = self.estimate.phase.get("gpu")
        if when:
            rows.append(f"<div style='font-size:11px;color:#555'>GPU peak: {html.escape(when)}; "
                        f"'tight' = within {memory.VERDICT_MARGIN:.0%} of the limit (allocator "
                        f"fragmentation, estimate error)</div>")
        return "".join(rows)

    def widget(self):
        """The whole form as one widget (display it, or let it be a cell's last value)."""
        import ipywidgets as w

        c = self.controls
        left = w.VBox(layout=w.Layout(min_width="360px"), children=[c["model"], c["custom_params"], c["stage"], c["offload_optimizer"], c["offload_param"],
                       self.reason, c["precision"], c["micro_batch"], c["grad_accum"], c["seq_len"], c["lr"],
                       c["grad_clip"], c["trainer"], c["grad_ckpt"], c["nvme_path"]])
        right = w.VBox([w.HTML("<b>Predicted memory</b>"), self.bars, w.HTML("<b>Problems</b>"), self.problems_view,
                        w.HBox([self.name, self.save_button]), self.status])
        return w.VBox([w.HBox([left, right]), w.HTML("<b>config JSON</b>"), self.json_view])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())


def form_checks(form: ConfigForm) -> list[tuple[str, bool]]:
    """Drive the form as a user would and check what it computed (then put it back as it was)."""
    before = form.values()
    out = []
    form.set(stage=3, offload_optimizer="nvme", offload_param="nvme")
    zero = form.config["zero_optimization"]
    out.append(("stage 3 + NVMe: the JSON preview follows the controls",
                zero["stage"] == 3 and zero["offload_param"]["device"] == "nvme" and "&quot;nvme&quot;" in form.json_view.value))
    out.append(("stage 3 + NVMe: NVMe memory is predicted", bool(form.estimate and form.estimate.total("nvme"))))
    form.set(stage=1)
    out.append(("below stage 3 parameter offload is disabled and reset",
                form.controls["offload_param"].disabled and form.controls["offload_param"].value == "none"))
    form.set(offload_optimizer="none", trainer=False, micro_batch=3, grad_accum=2)
    out.append(("engine mode: batch sizes agree (3 x 2 = 6)", form.config["train_batch_size"] == 6))
    if not form.environment.native_bf16:
        form.set(precision="bf16")
        out.append(("bf16 without native support is flagged", any(p.path == "bf16.enabled" for p in form.problems)
                    and "red" in form.problems_view.value))
        form.set(precision="auto")
    form.set(model="custom", custom_params=7_000_000_000, stage=0)
    gpu_bar = form.bars.value.split("GPU</span>", 1)[-1].split("</div>", 1)[0]
    out.append(("a 7B model at stage 0 does not fit the GPU bar", gpu_bar.endswith(memory.NO_FIT)))
    form.name.value = "../outside"
    out.append(("a bad file name is refused, nothing written", form.save() is None and "not saved" in form.status.value))
    form.set(**before)
    return out


def prediction_takeaways(model: memory.ModelInfo, environment: kit_env.Environment, mistakes_caught: int,
                         mistakes: int, measured: runner.RunResult | None, micro_batch: int,
                         seq_len: int) -> list[str]:
    """Notebook 03's summary: what the checker caught and what the estimator predicted and measured."""
    def gpu_of(choice: dict) -> float:
        ds = config.for_row(choice, model, environment, micro_batch)
        est = memory.estimate(model, ds, micro_batch=micro_batch, seq_len=seq_len, on_gpu=environment.has_gpu)
        return est.total("gpu" if environment.has_gpu else "cpu") / GiB

    place = "GPU" if environment.has_gpu else "host RAM (no GPU here)"
    lines = [f"The checker caught {mistakes_caught} of {mistakes} common mistakes, each at its key with the fix.",
             f"{model.name} ({model.n_params / 1e6:,.0f}M parameters) at {micro_batch} x {seq_len}: predicted "
             f"{place} {gpu_of({'stage': 0}):.2f} GiB at stage 0, {gpu_of({'stage': 2}):.2f} at stage 2, "
             f"{gpu_of({'stage': 2, 'offload_optimizer': 'cpu'}):.2f} at stage 2 with CPU offload."]
    if measured is not None and measured.status == runner.OK:
        peak = measured.peak_gpu_allocated_bytes if environment.has_gpu else measured.peak_host_rss_bytes
        lines.append(f"Measured in a fresh process, the lesson's config ({measured.label}): peaked at "
                     f"{peak / GiB:.2f} GiB of {place}.")
    lines.append("Next: 04 · ZeRO-2 training: the Trainer code that uses such a config.")
    return lines


# ---- the form's config as code you keep ----------------------------------------------------------
#: A short comment for the keys a config from the form holds (dotted paths; a bare name is any
#: key of that name). config.explain says more, in a table.
KEY_COMMENTS = {
    "train_batch_size": "micro batch x accumulation x GPUs",
    "train_micro_batch_size_per_gpu": "what one GPU takes per forward",
    "gradient_accumulation_steps": "micro batches per optimizer step",
    "gradient_clipping": "the largest gradient norm kept",
    "optimizer": "DeepSpeed builds it; AdamW keeps 12 bytes/param",
    "steps_per_print": "DeepSpeed's own progress lines: off",
    "wall_clock_breakdown": "timings per phase: off",
    "fp16": "fp16 with dynamic loss scaling (a T4)",
    "fp16.initial_scale_power": "the first loss scale is 2**this",
    "bf16": "bfloat16, from compute capability 8.0",
    "zero_optimization": "what ZeRO partitions and offloads",
    "zero_optimization.stage": "1: optimizer states, 2: + gradients, 3: + weights",
    "contiguous_gradients": "gradients in one buffer: less fragmentation",
    "reduce_bucket_size": "elements reduced at a time",
    "allgather_bucket_size": "elements gathered at a time",
    "overlap_comm": "True overlaps communication, at more memory",
    "offload_optimizer": "optimizer states and step off the GPU",
    "offload_param": "the weights off the GPU (stage 3)",
    "pin_memory": "page-locked host RAM: faster, never swapped",
    "nvme_path": "a fast local disk",
    "sub_group_size": "elements the optimizer steps at a time",
}
#: Longest line of the code :func:`config_as_python` writes (the kit's code lines: 100).
CODE_WIDTH = 100


def _python_literal(value) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def config_as_python(ds_config: dict, name: str = "ds_config") -> str:
    """``ds_config`` as the source of a Python dict, one key a line, with a comment for the keys
    :data:`KEY_COMMENTS` knows: what notebook 03's lesson cell holds, for the form's settings."""
    lines = [f"{name} = {{"]

    def walk(mapping: dict, indent: int, path: str) -> None:
        pad = " " * indent
        for key, value in mapping.items():
            dotted = f"{path}.{key}" if path else key
            comment = KEY_COMMENTS.get(dotted, KEY_COMMENTS.get(key, ""))
            if isinstance(value, dict) and value:
                head = f"{pad}{json.dumps(key)}: {{"
                lines.append(head + (f"  # {comment}" if comment else ""))
                walk(value, indent + 4, dotted)
                lines.append(f"{pad}}},")
                continue
            line = f"{pad}{json.dumps(key)}: {_python_literal(value)},"
            if comment and len(line) + len(comment) + 4 <= CODE_WIDTH:
                line += f"  # {comment}"
            elif comment:
                lines.append(f"{pad}# {comment}")
            lines.append(line)

    walk(ds_config, 4, "")
    lines.append("}")
    return "\n".join(lines)


def problems_table(problems: list[config.Problem]) -> Table:
    """What the checker found in a config, one row per problem (a single row saying so if none)."""
    rows = [(p.level, p.path, p.message, p.fix) for p in problems] or [("-", "-", "no problems", "-")]
    return Table(["level", "key", "problem", "fix"], rows, title="The checker on your config")


# ---- the mistakes notebook 03 demonstrates ------------------------------------------------------------


@dataclass
class Mistake:
    """A broken config, the key where check() must report it, and what check() said."""

    name: str
    config: dict
    expected_path: str
    problems: list
    caught: bool


def mistakes(base: dict, environment: kit_env.Environment) -> list[Mistake]:
    """Ten common mistakes applied to ``base`` (an engine-mode config), each checked."""
    t4 = config.t4_profile(environment)
    xl = memory.ModelInfo.for_shape("gpt2-1.5b")

    def variant(change) -> dict:
        c = json.loads(json.dumps(base))
        change(c)
        return c

    micro = base["train_micro_batch_size_per_gpu"]
    cases = [
        ("typo at the top level", variant(lambda c: c.update(fp_16={"enabled": True})), "fp_16", {}),
        ("typo inside zero_optimization", variant(lambda c: c["zero_optimization"].update(overlap_com=True)),
         "zero_optimization.overlap_com", {}),
        ("batch sizes disagree", variant(lambda c: c.update(train_batch_size=micro * 2 + 1)), "train_batch_size", {}),
        ('"auto" without the Trainer', variant(lambda c: c.update(gradient_clipping="auto")), "gradient_clipping",
         {"for_trainer": False}),
        ("parameter offload below stage 3", variant(lambda c: c["zero_optimization"].update(
            stage=2, offload_param={"device": "cpu"})), "zero_optimization.offload_param.device", {}),
        ("bf16 on a T4", variant(lambda c: (c.pop("fp16", None), c.update(bf16={"enabled": True}))), "bf16.enabled",
         {"hardware": t4}),
        ("fp16 and bf16 both on", variant(lambda c: c.update(fp16={"enabled": True}, bf16={"enabled": True})),
         "bf16.enabled", {}),
        ("NVMe offload without a path", variant(lambda c: c["zero_optimization"].update(
            stage=3, offload_optimizer={"device": "nvme"})),  # below stage 3 it runs on the CPU
         "zero_optimization.offload_optimizer.nvme_path", {}),
        ("NVMe buffers smaller than GPT-2 XL's largest tensor", variant(lambda c: c["zero_optimization"].update(
            stage=3, offload_param={"device": "nvme", "nvme_path": str(kit_env.default_offload_dir()),
                                    "buffer_size": 10_000_000, "buffer_count": 5})),
         "zero_optimization.offload_param.buffer_size", {"model": xl}),
        ("pinned memory with Colab's 12.7 GB", variant(lambda c: c["zero_optimization"].update(
            offload_optimizer={"device": "cpu", "pin_memory": True})),
         "zero_optimization.offload_optimizer.pin_memory", {"hardware": t4}),
    ]
    out = []
    for name, broken, path, kwargs in cases:
        found = config.check(broken, for_trainer=kwargs.pop("for_trainer", True), **kwargs)
        out.append(Mistake(name, broken, path, found, any(p.path == path for p in found)))
    return out


def mistakes_table(cases: list[Mistake]) -> Table:
    rows = []
    for m in cases:
        hit = next((p for p in m.problems if p.path == m.expected_path), None)
        rows.append((m.name, m.expected_path, "yes" if m.caught else "NO", hit.message if hit else "-",
                     hit.fix if hit else "-"))
    return Table(["mistake", "key", "caught", "what check() says", "fix"], rows, title="Mistakes, caught")
