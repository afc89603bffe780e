# bf16 dense outputs vs float32, the same run otherwise: runs/shakespeare-char with GPT-2's biases, compute_dtype bfloat16
set -e
export JAXGPT_DATA_DIR=/tmp/ddq/data
for dd in float32 compute; do
  rm -rf /tmp/ddq/$dd && cp -r /work/main/runs/shakespeare-char /tmp/ddq/$dd
  python3 - /tmp/ddq/$dd/model.json $dd <<'PY'
import json, sys
p, dd = sys.argv[1], sys.argv[2]
d = json.load(open(p)); d.update(bias=True, qkv_bias=True, compute_dtype="bfloat16", dense_dtype=dd)
open(p, "w").write(json.dumps(d, indent=2))
PY
  (cd /work/main && uv run train.py /tmp/ddq/$dd) > /tmp/ddq/$dd.log 2>&1
done
