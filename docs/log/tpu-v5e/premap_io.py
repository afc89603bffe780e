"""Host <-> chip copies under libtpu's premapped host buffer (TPU_PREMAPPED_BUFFER_SIZE as set outside):
one JSON line: opening the chip, RSS, 1 GiB host->chip and chip->host (float32, best of 3)."""
import json, os, time
import numpy as np
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return round(int(line.split()[1]) / 1e6, 2)
T = {"premapped": os.environ.get("TPU_PREMAPPED_BUFFER_SIZE", "default")}
t = time.perf_counter()
import jax
jax.devices()
T["open_s"] = round(time.perf_counter() - t, 2); T["rss_open_gb"] = rss()
x = np.random.default_rng(0).standard_normal(2**28, dtype=np.float32)  # 1 GiB
up, down = [], []
for _ in range(3):
    t = time.perf_counter(); d = jax.block_until_ready(jax.device_put(x)); up.append(time.perf_counter() - t)
    t = time.perf_counter(); h = np.asarray(d); down.append(time.perf_counter() - t)
    assert np.array_equal(h, x)
    del d, h
T["to_chip_gbs"] = round(1.074 / min(up), 2); T["to_host_gbs"] = round(1.074 / min(down), 2); T["rss_end_gb"] = rss()
print(json.dumps(T), flush=True)
