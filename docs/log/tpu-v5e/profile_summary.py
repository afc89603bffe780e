"""Where a TPU step's time went: xprof's framework op stats of a jax.profiler trace, device side, grouped."""
import glob, json, sys, tarfile, tempfile, collections
from xprof.convert import raw_to_tool_data as r
tgz, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
d = tempfile.mkdtemp(); tarfile.open(tgz).extractall(d)
files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
data, _ = r.xspace_to_tool_data(files, "framework_op_stats", {})
table = json.loads(data)[0]
cols = [c["id"] for c in table["cols"]]
rows = [dict(zip(cols, [c.get("v") for c in row["c"]])) for row in table["rows"]]
dev = [x for x in rows if x["host_or_device"] == "Device"]
total = sum(x["total_self_time"] for x in dev)
print(f"device self time {total/1e3:.1f} ms over the trace")
by = collections.Counter()
for x in dev: by[x["type"]] += x["total_self_time"]
for t, v in by.most_common(15): print(f"  {t:40s} {v/1e3:9.1f} ms {100*v/total:5.1f}%")
print("top ops:")
for x in sorted(dev, key=lambda x: -x["total_self_time"])[:top]:
    print(f"  {x['total_self_time']/1e3:8.1f} ms {100*x['total_self_time']/total:5.1f}% x{x['occurrences']:<4} {x['type'][:20]:20s} {x['operation'][:70]}  {x.get('measured_flop_rate') or 0:.3g} FLOP/s {x.get('measured_memory_bw') or 0:.0f} GB/s {x.get('bound_by')}")
