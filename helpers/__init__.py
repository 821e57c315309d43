"""ZeRO Kit helpers: the logic behind the notebooks, one module per concern.

Modules are imported lazily by the notebooks (``from helpers import env``) so that importing the
package never pulls in torch or DeepSpeed by itself.

The layers, bottom first. A module imports only from layers below its own (tests/test_layers.py
enforces it, lazy imports inside functions included), so there are no import cycles:

0. show, cli, colab, deepspeed_fixes, data, accounting, rss_trace: formatting, command
   lines, installs, text, the bytes a DeepSpeed rank holds, host RAM per phase of a run
1. claims, models, verdict, parallel_models: the shared check rules, figures, model shapes
   and offline checkpoints, notebook
   08's models (a GPT as pipeline layers, a mixture-of-experts GPT) and training steps
2. env: machine facts (GPU, precision, RAM, disk, emulation; the libaio probe; one-process
   distributed setup)
3. memory: the memory estimator and the three-way verdict (fits / tight / does not fit; pure
   arithmetic)
4. config_check: every value DeepSpeed would reject, found before an engine starts
5. config: build, explain, save and load DeepSpeed configs
6. bench, doctor: one run in a subprocess (the runner); ds_report explained
7. matrix, infinity, finetune, train, machine_check: notebook-level logic (05, 06 and its
   fine-tune, 04, 01)
8. widgets, zero_picture, three_ways, measurements, offload_speed: notebook 03's form, the ZeRO
   picture, notebook 07's paths, the stored memory measurements and the estimator checked against
   them, notebook 05's faster offload; parallel: notebook 08's pipeline, MoE and AutoTP runs
9. sizing: ``python -m helpers sizing``, any model's memory per stage and offload with the verdict,
   beside DeepSpeed's and Accelerate's estimators
"""

#: The layers above, as data (bottom first): what tests/test_layers.py checks.
LAYERS: list[list[str]] = [
    ["show", "colab", "deepspeed_fixes", "data"],
    ["claims", "models", "parallel_models"],
    ["env"],
    ["memory"],
    ["config_check"],
    ["config"],
    ["runner", "doctor"],
    ["matrix", "infinity", "finetune", "train", "machine_check"],
    ["widgets", "zero_picture", "three_ways", "measurements", "offload_speed", "parallel"],
    ["sizing"],
    ["cli"],
    ["__main__"],
]
