"""Where a TPU step's time went, per XLA instruction: xprof's hlo_stats of a jax.profiler trace (speed.py's
prof-*.tgz), the top N by self time, then the self time by category.
    python3 hlo_stats.py prof-2026-full.tgz 30
"""
import collections, glob, json, sys, tarfile, tempfile
from xprof.convert import raw_to_tool_data as r
d = tempfile.mkdtemp(); tarfile.open(sys.argv[1]).extractall(d)
files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
data, _ = r.xspace_to_tool_data(files, "hlo_stats", {})
table = json.loads(data); table = table[0] if isinstance(table, list) else table
cols = [c["id"] for c in table["cols"]]
rows = [dict(zip(cols, [c.get("v") for c in row["c"]])) for row in table["rows"]]
for x in sorted(rows, key=lambda x: -(x.get("total_self_time") or 0))[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]:
    print(f"{(x.get('total_self_time') or 0)/1e3:7.1f} ms x{x.get('occurrences')} {x.get('category')} | {str(x.get('hlo_op_expression'))[:260]}")
by = collections.Counter()
for x in rows: by[x.get("category")] += x.get("total_self_time") or 0
print({k: round(v / 1e3, 1) for k, v in by.most_common()})
