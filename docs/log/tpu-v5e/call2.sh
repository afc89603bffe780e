# Call 2: start-up (cold, then warm compile cache), engine decoding in bf16 (bursts vs one step per dispatch),
# every shipped 124M run started through the memory plan. Everything under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PYTHONPATH:$PWD JAXGPT_CACHE_DIR=/tmp/jc
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
for i in cold warm; do timeout 90 python3 .accel/startup3.py runs/gpt2-small runs/gpt2-small-2026 2>&1 | grep '^{' | sed "s/^/$i /" | tee -a $OUT/startup.txt; done
for spec in "1 16" "16 16" "1 1" "16 1"; do set -- $spec
  timeout 75 python3 -m bench generate --single --cached-only --repeats 2 --batch-size $1 --burst $2 --new-tokens 256 --model compute_dtype=bfloat16 --json /tmp/gen-b$1-u$2.json 2>&1 | grep -i "cached:\|error" | sed "s/^/b$1 burst$2: /" | tee -a $OUT/generate.txt
done
python3 .accel/fits.py /tmp/fit $(left 520) 2>&1 | tee $OUT/fits.txt
tar czf $OUT/fit-logs.tgz -C /tmp/fit $(cd /tmp/fit && ls *.log) 2>/dev/null
echo "call 2 done in $(( $(date +%s) - T0 )) s"
