"""Model construction on praxis. Importing this package applies the praxis compat patches."""

from layers import praxis_compat  # noqa: F401  (must run before any praxis import)
