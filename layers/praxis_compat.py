"""Make praxis 1.4.0 run on the jax this project pins (0.10).

praxis 1.4.0, the last release on PyPI, was written against jax 0.4.26. Newer
jax removed a few names it still uses at import or trace time. Each patch below
restores one name, says which praxis call needs it, and is covered by
tests/test_praxis_compat.py. Import this module before anything from praxis;
`layers/__init__.py` does, so `import layers` is enough.
"""

import jax
import jax.lib
import jax.tree_util

# praxis/base_input.py does `from jax.lib import xla_client as xc` at import time
# (it builds an `xc.OpSharding` for host-to-global input layouts). jax 0.5
# stopped re-exporting xla_client from jax.lib; the module itself still exists.
if not hasattr(jax.lib, "xla_client"):
    from jax._src.lib import xla_client as _xla_client

    jax.lib.xla_client = _xla_client

# jax 0.6 removed the `jax.tree_*` aliases of `jax.tree_util.tree_*`. praxis 1.4.0
# still calls two of them:
#   jax.tree_map      layers/repeats.py (StackedTransformerRepeated's scan),
#                     layers/attentions.py, flax_utils.py, py_utils.py
#   jax.tree_flatten  py_utils.py (used by praxis's masked tree helpers)
for _name in ("tree_map", "tree_flatten"):
    if not hasattr(jax, _name):
        setattr(jax, _name, getattr(jax.tree_util, _name))
