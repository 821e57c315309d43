"""The notebooks' own helpers: one module per notebook that needs one, named after it (notebook
05_stages_and_offload's is ``helpers.lessons.stages_and_offload``). A layer above the core
modules of helpers/: a lesson imports the core (and an earlier lesson), never the reverse
(helpers.LAYERS lists them; tests/test_layers.py enforces it)."""
