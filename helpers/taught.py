"""The lesson code the kit's own runs call, generated from the notebooks: every function a
cell tagged "export" defines, as the cell writes it, headed by its notebook and cell. Do not edit:
edit the notebook's cell, then run  python tools/nbtool.py export  (tests/test_taught.py fails
while this file and the notebooks differ). Each cell's imports come along; nothing else of it runs.
"""


# ---- notebooks/07_engine_and_accelerate.ipynb, cell 16 -------------------------------------------
def train_step(engine, batch):
    """One optimizer step through DeepSpeed's engine; returns the batch's loss. The kit's own
    measured runs (notebooks 05, 06, 09, python -m helpers bench) call this same function."""
    loss = engine(**batch).loss  # the batch carries its labels
    engine.backward(loss)  # fp16 loss scaling; gradients reduced into ZeRO's partitions
    engine.step()  # the optimizer and the scheduler; the gradients zeroed
    return loss.item()
