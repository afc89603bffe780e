"""Call-1 diagnostics on the TPU (not part of the project)."""
import json, os, sys, time, resource, shutil
from pathlib import Path
import numpy as np

mode = sys.argv[1]
OUT = Path(os.environ.get("OUT", "/tmp/out"))

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6

if mode == "roundtrip":
    run_dir = Path(sys.argv[2]); nocache = len(sys.argv) > 3
    from jaxgpt import caches
    if not nocache:
        print("cache", caches.enable_compile_cache())
    import jax
    from jaxgpt.training.run import prepare_run
    from jaxgpt.training import loop, train_step
    from jaxgpt.checkpoints import store
    from jaxgpt.stopping import StopFlag
    from jaxgpt.evaluation.scoring import eval_sums
    from jaxgpt.model.gpt import build_model
    from safetensors.numpy import load_file
    runners = []
    orig_init = train_step.StepRunner.__init__
    def init(self, *a, **k):
        orig_init(self, *a, **k)
        ptrs = [l.unsafe_buffer_pointer() for l in self.leaves]
        print("runner leaves", len(ptrs), "distinct buffers", len(set(ptrs)), flush=True)
        runners.append(self)
    train_step.StepRunner.__init__ = init
    run = prepare_run(run_dir, data_root=run_dir.parent / "data", restart=False)
    vb = run.val_batches.microbatch(0)
    orig_save = store.save_checkpoint
    def save(run_dir_, model, optimizer, meta, configs, **kw):
        mem = store.weights_to_numpy(model)
        direct = {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in __import__("flax").nnx.to_flat_state(__import__("flax").nnx.state(model, __import__("flax").nnx.Param))}
        deleted = [p for p, v in __import__("flax").nnx.to_flat_state(__import__("flax").nnx.state(model)) if hasattr(v.get_value(), "is_deleted") and v.get_value().is_deleted()]
        r = runners[-1]
        ptr_model = sorted(v.get_value().unsafe_buffer_pointer() for _, v in __import__("flax").nnx.to_flat_state(__import__("flax").nnx.state(model, __import__("flax").nnx.Param)))
        ptr_leaves = set(l.unsafe_buffer_pointer() for l in r.leaves)
        import jax as _jax
        raws = {".".join(map(str, p)): np.asarray(_jax.device_get(v.get_value())) for p, v in __import__("flax").nnx.to_flat_state(__import__("flax").nnx.state(model, __import__("flax").nnx.Param))}
        copies = {k: np.array(v, copy=True) for k, v in raws.items()}
        fl = __import__("flax").nnx.to_flat_state(__import__("flax").nnx.state(model, __import__("flax").nnx.Param))
        flags = {".".join(map(str, p)): (bool(raws[".".join(map(str, p))].flags.c_contiguous), bool(raws[".".join(map(str, p))].flags.owndata), type(raws[".".join(map(str, p))].base).__name__, str(getattr(v.get_value(), "format", ""))[:80]) for p, v in list(fl)[:6]}
        path = orig_save(run_dir_, model, optimizer, meta, configs, **kw)
        raw_changed = max(float(np.abs(raws[k] - copies[k]).max()) for k in raws)
        print(json.dumps({"flags": flags, "raw_changed_during_save": raw_changed}), flush=True)
        f = load_file(str(path / "model.safetensors"))
        d_file = max(float(np.abs(f[k] - mem[k]).max()) for k in mem)
        m2, cfg, tok, _ = store.load_model(path)
        w2 = store.weights_to_numpy(m2)
        d_load = max(float(np.abs(w2[k] - f[k]).max()) for k in f)
        init_w = store.weights_to_numpy(build_model(cfg, seed=0))
        d_init = max(float(np.abs(init_w[k] - f[k]).max()) for k in f)
        args = (vb.inputs, vb.targets, np.ones(vb.inputs.shape, np.float32))
        s1, n1 = eval_sums(model, *args)
        s2, n2 = eval_sums(m2, *args)
        print(json.dumps({"step": meta["step"], "val_logged": meta["val_loss"], "deleted_in_model": len(deleted),
                          "model_params_in_runner_leaves": all(p in ptr_leaves for p in ptr_model),
                          "file_vs_memory": d_file, "loaded_vs_file": d_load, "file_vs_init": d_init,
                          "loss_train_model": float(s1 / n1), "loss_loaded_model": float(s2 / n2)}), flush=True)
        return path
    store.save_checkpoint = save
    with StopFlag() as stop:
        code = loop.train(run, stop)
    print("train exit", code)

elif mode == "startup":
    variant, run_dir = sys.argv[2], Path(sys.argv[3])
    t0 = time.perf_counter()
    import jax, jax.numpy as jnp
    from flax import nnx
    from jaxgpt.config import load_run_configs
    from jaxgpt.model.gpt import build_model
    from jaxgpt.training.optimizer import make_optimizer
    from jaxgpt.distributed import sharding
    mcfg, tcfg = load_run_configs(run_dir)
    jax.devices()
    t1 = time.perf_counter(); r1 = rss()
    mesh = sharding.make_mesh(tcfg.mesh, tcfg.microbatch_size)
    if variant == "old":
        def build():
            m = build_model(mcfg, seed=0); return m, make_optimizer(m, tcfg, 1000)
        model, opt = sharding.create_sharded(build, mesh, tcfg.mesh.fsdp, where="x")
    else:
        def build(key):
            m = build_model(mcfg, seed=key); return m, make_optimizer(m, tcfg, 1000)
        abstract = nnx.eval_shape(lambda: build(jax.random.key(0)))
        shardings = sharding.state_shardings(nnx.state(abstract), mesh, False)
        @nnx.jit
        def create(key):
            objs = build(key)
            nnx.update(objs, jax.lax.with_sharding_constraint(nnx.state(objs), shardings))
            return objs
        model, opt = create(jax.random.key(0))
    jax.block_until_ready(jax.tree.leaves(nnx.state(opt)))
    t2 = time.perf_counter()
    w = jax.tree.leaves(nnx.state(model, nnx.Param))
    print(json.dumps({"variant": variant, "run": str(run_dir), "backend_s": t1 - t0, "build_s": t2 - t1,
                      "rss_before_gb": r1, "rss_after_gb": rss(), "param_sum": float(sum(jnp.sum(x) for x in w))}), flush=True)

elif mode == "kernels":
    import jax, jax.numpy as jnp
    from functools import partial
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk, splash_attention_mask as sm
    def timeit(f, *a, n=10):
        r = f(*a); jax.block_until_ready(r)
        t = time.perf_counter()
        for _ in range(n): r = f(*a)
        jax.block_until_ready(r)
        return (time.perf_counter() - t) / n * 1e3
    for (B, H, T, D, win) in [(16, 12, 1024, 64, None), (8, 6, 2048, 128, None), (8, 6, 2048, 128, 512)]:
        k0 = jax.random.split(jax.random.key(0), 4)
        q, k, v = (jax.random.normal(kk, (B, H, T, D), jnp.bfloat16) for kk in k0[:3])
        do = jax.random.normal(k0[3], (B, H, T, D), jnp.bfloat16)
        def xla(q, k, v):
            s = jnp.einsum("bhtd,bhsd->bhts", q, k, preferred_element_type=jnp.float32) / np.sqrt(D)
            t_, s_ = jnp.arange(T)[:, None], jnp.arange(T)[None]
            m = s_ <= t_ if win is None else (s_ <= t_) & (t_ - s_ < win)
            p = jax.nn.softmax(jnp.where(m, s, -jnp.inf), -1)
            return jnp.einsum("bhts,bhsd->bhtd", p.astype(q.dtype), v, preferred_element_type=jnp.float32)
        def flash(q, k, v):
            return fa.flash_attention(q, k, v, causal=True, sm_scale=1 / np.sqrt(D), block_sizes=fa.BlockSizes(block_q=512, block_k_major=512, block_k=512, block_b=1, block_q_major_dkv=512, block_k_major_dkv=512, block_k_dkv=512, block_q_dkv=512, block_k_major_dq=512, block_k_dq=512, block_q_dq=512))
        mask = sm.CausalMask((T, T)) if win is None else sm.LocalMask((T, T), (win - 1, 0), 0)
        for bs in (512, 1024, -512):
            fused = bs < 0; bs = abs(bs)
            try:
                bsz = sk.BlockSizes(block_q=min(bs, T), block_kv=min(bs, T), block_kv_compute=min(bs, T), block_q_dkv=min(bs, T), block_kv_dkv=min(bs, T), block_kv_dkv_compute=min(bs, T), block_q_dq=None if fused else min(bs, T), block_kv_dq=None if fused else min(bs, T), use_fused_bwd_kernel=fused)
                kern = sk.make_splash_mha(sm.MultiHeadMask([mask] * H), head_shards=1, q_seq_shards=1, block_sizes=bsz)
                def splash(q, k, v, kern=kern):
                    return jax.vmap(kern)(q / np.sqrt(D).astype(q.dtype), k, v)
                fns = {"xla": xla, "flash512": flash, f"splash{bs}{'fused' if fused else ''}": splash}
            except Exception as e:
                print("splash setup failed", bs, repr(e)[:300]); fns = {"xla": xla, "flash512": flash}
            ref = None
            for name, f in fns.items():
                if (bs == 1024 or fused) and name in ("xla", "flash512"): continue
                try:
                    fwd = jax.jit(f)
                    bwd = jax.jit(lambda q, k, v, f=f: jax.vjp(f, q, k, v)[1](do.astype(jnp.float32) if name == "xla" else do))
                    y = fwd(q, k, v)
                    if name == "xla": ref = y
                    err = None if ref is None else float(jnp.abs(y.astype(jnp.float32) - ref).max())
                    print(json.dumps({"shape": [B, H, T, D, win], "kernel": name, "fwd_ms": timeit(fwd, q, k, v), "fwd_bwd_ms": timeit(bwd, q, k, v), "max_err_vs_xla": err}), flush=True)
                except Exception as e:
                    print(json.dumps({"shape": [B, H, T, D, win], "kernel": name, "error": repr(e)[:400]}), flush=True)
