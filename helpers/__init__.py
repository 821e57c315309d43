"""ZeRO Kit helpers: the logic behind the notebooks, one module per concern.

Modules are imported lazily by the notebooks (``from helpers import env``) so that importing the
package never pulls in torch or DeepSpeed by itself.
"""

__all__ = ["colab", "env", "memory", "tables"]
