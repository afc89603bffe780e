"""How the model's matmuls and attention run: neutral.py (every backend), cpu.py (XLA:CPU), select.py (which, once)."""

from jaxgpt.ops.neutral import Ops, Product, causal_attention, mixed_einsum, plain_product
from jaxgpt.ops.select import attention_kernel, resolve_compute_dtype, select

__all__ = [
    "Ops",
    "Product",
    "attention_kernel",
    "causal_attention",
    "mixed_einsum",
    "plain_product",
    "resolve_compute_dtype",
    "select",
]
