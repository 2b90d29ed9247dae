. bench/device_env.sh; B=.devbin-main
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== recipe linears beside torch BF16 F.linear"
"$PY" bench/gpu_peer.py --bin "$B" --json "$OUT/gpu_peer.json" > "$OUT/gpu_peer.log" 2>&1; echo "exit $?"
grep -E "^[0-9]+x[0-9]+ " "$OUT/gpu_peer.log"
echo "== gpu_check quantize linear"
"$B/gpu_check" quantize linear > "$OUT/gpu_check.log" 2>&1; echo "exit $?"; grep -E "^FAIL" "$OUT/gpu_check.log" | head; tail -1 "$OUT/gpu_check.log"
echo "== flux-small through [nvfp4 @ 0, fp8_block @ 40]"
timeout 90 "$B/mxswitch" train --device cuda --config tests/configs/flux-small-nvfp4.ron --out /tmp/fsn --overwrite > "$OUT/flux_small_nvfp4.log" 2>&1; echo "exit $?"
grep -E "now|trained|error" "$OUT/flux_small_nvfp4.log" | tail -4; cp /tmp/fsn/metrics.jsonl "$OUT/flux_small_nvfp4_metrics.jsonl"
