"""The model's attention on a TPU: Pallas splash attention (jax.experimental.pallas.ops.tpu), chosen by select.py.

    ops = TpuOps("tpu", "bfloat16", "splash")      # model.json attention "auto" on one TPU chip
    ops.attention(q, k, v, window=w, segments=s)   # as neutral.Ops.attention

Splash attention never forms the (T, T) scores (XLA's attention keeps them, in float32, for the
backward pass: 0.8 GB per layer at GPT-2 124M's 16 x 1024) and skips the blocks a causal or
sliding-window mask hides, so a short-window layer costs about window / T of a full one. Queries
are scaled before the kernel; grouped-query keys and values are repeated to the query heads;
packed conversations pass their segment ids. Dropout on the attention weights, and sequences
whose length is not a multiple of BLOCK_MIN (a short prefill), take the neutral path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

from jaxgpt.ops.neutral import Ops

BLOCK = 512  # query and key rows per kernel block (the fastest tried on a v5e: docs/performance.md)
BLOCK_MIN = 128  # a block's rows are a multiple of this


def splash_fits(T: int) -> bool:
    """Whether sequences of T tokens split into the kernel's blocks."""
    return T % BLOCK_MIN == 0


@dataclass(frozen=True)
class TpuOps(Ops):
    """`Ops` on a TPU: attention through splash attention where it applies (module docstring)."""

    interpret: bool = False  # run the Pallas kernels in Python: the tests' way on a CPU
    # A decode step's scatter into the KV cache made XLA copy the whole cache to another layout and
    # back around every decode program here; the select needs no copy (kv_cache.KVCache.write).
    cache_write: str = "select"
    # In the 2026 recipe's scanned step each layer scattered into all the value tables inside the backward
    # loop; gathered once, 339.5 ms a microbatch against 354.3 (docs/log.md).
    value_rows_once: bool = True

    def names_residuals(self, T: int, dropout: Callable[[jax.Array], jax.Array] | None) -> bool:
        return self._splash(T, dropout)  # residual_checkpoint_name below

    def _splash(self, T: int, dropout: Callable[[jax.Array], jax.Array] | None) -> bool:
        return self.attention_kernel == "splash" and dropout is None and splash_fits(T)

    def attention(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        dropout: Callable[[jax.Array], jax.Array] | None = None,
        window: int | jax.Array | None = None,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        if not self._splash(q.shape[1], dropout):
            return super().attention(q, k, v, dropout, window, segments)
        run = functools.partial(splash_attention, dtype=self.compute_dtype, interpret=self.interpret)
        if window is None or isinstance(window, int):
            return run(q, k, v, segments, window)
        # A scanned model's window is traced: one kernel per window the model has, the layer's taken.
        branches = [functools.partial(run, window=w) for w in self.windows]
        return jax.lax.switch(jnp.argmax(jnp.asarray(self.windows) == window), branches, q, k, v, segments)


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segments: jax.Array | None,
    window: int | None,
    *,
    dtype: str,
    interpret: bool = False,
) -> jax.Array:
    """Causal attention q (B, T, H, D), k and v (B, T, K, D) -> (B, T, H*D) float32, each query
    seeing `window` tokens (itself included; None: all earlier ones) of its own segment."""
    B, T, H, D = q.shape
    if k.shape[2] != H:
        k, v = (jnp.repeat(t, H // k.shape[2], axis=2) for t in (k, v))  # (B, T, H, D)
    kernel = _kernel(T, H, None if window is None or window >= T else window, interpret)
    heads_first = lambda t: t.astype(dtype).transpose(0, 2, 1, 3)  # noqa: E731 - (B, H, T, D)
    qh, kh, vh = heads_first(q * D**-0.5), heads_first(k), heads_first(v)
    if segments is None:
        y = jax.vmap(kernel)(qh, kh, vh)  # (B, H, T, D)
    else:
        y = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s)))(qh, kh, vh, segments)
    return y.astype(jnp.float32).transpose(0, 2, 1, 3).reshape(B, T, H * D)


@functools.lru_cache(maxsize=32)
def _kernel(T: int, H: int, window: int | None, interpret: bool) -> splash.SplashAttentionKernel:
    """The kernel for H heads of T tokens, causal or a causal window; built once per shape."""
    mask = masks.CausalMask((T, T)) if window is None else masks.LocalMask((T, T), (window - 1, 0), 0)
    b = min(BLOCK, T)
    sizes = splash.BlockSizes(
        block_q=b,
        block_kv=b,
        block_kv_compute=b,
        block_q_dkv=b,
        block_kv_dkv=b,
        block_kv_dkv_compute=b,
        use_fused_bwd_kernel=True,  # dq with dk and dv in one pass: the fastest backward tried
    )
    # Built outside any trace: the kernel holds its block masks as arrays, cached for every later trace.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(
            masks.MultiHeadMask([mask] * H),
            block_sizes=sizes,
            head_shards=1,
            q_seq_shards=1,
            # its output and log-sum-exp, what its backward kernel reads: kept by model.json remat
            # "attention" and "dots" (gpt.REMAT_POLICIES), so the backward pass never reruns the kernel
            residual_checkpoint_name="attention",
            interpret=interpret,
        )
