"""Why the KV-cached decoder and the full forward differ more on the TPU with dense_dtype "compute".

    python3 .accel/dense_decode.py     (PYTHONPATH with the repository and tests/; one JSON line per case)

For each bfloat16 layout of tests/generation/test_generate.py: the largest decoder-vs-full difference
(the test's), its bound, and the full forward jitted against the same forward run op by op
(jax.disable_jit: every op's output written in its dtype). Hypothesis: on the TPU the rounding of the
bfloat16 dense outputs depends on how XLA fuses a program (its bias add and activation kept in float32
inside a fusion, or not), so two programs of the same model differ by several roundings, not one; the
op-by-op forward would then differ from the jitted one by as much as the decoder does.
"""
import json, sys
import numpy as np
import jax
import tests.generation.test_generate as tg  # noqa: E402 - run from the repository root

g = tg.g
for name in ("bfloat16", "bfloat16-untied", "2026-bfloat16", "bfloat16-dense", "2026-bfloat16-dense"):
    model = tg.tiny(1, **tg.LAYOUTS[name])
    seq = np.random.default_rng(2).integers(0, tg.V, tg.CTX).tolist()
    ref = tg.full_logits(model, seq)
    dec = g.KVDecoder(model, 1)
    got = dec.prefill([seq[:9]])
    diffs = {8: float(np.abs(got[0] - ref[8]).max())}
    while (dec.lengths < tg.CTX).any():
        p = int(dec.lengths[0])
        got = dec.step([seq[p]])
        diffs[p] = float(np.abs(got[0] - ref[p]).max())
    with jax.disable_jit():
        window = np.zeros((1, tg.CTX), np.int32); window[0] = seq
        eager = np.asarray(model(jax.numpy.asarray(window)))[0]
    print(json.dumps({"layout": name, "decoder_max": max(diffs.values()), "worst_position": max(diffs, key=diffs.get),
                      "bound": tg.tolerance(ref, "bfloat16"), "jit_vs_eager_max": float(np.abs(eager - ref).max()),
                      "max_logit": float(np.abs(ref).max())}), flush=True)
