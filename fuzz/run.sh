#!/usr/bin/env bash
# Runs every fuzz target in turn for SECONDS each (default 60), in-process on one core (the machine is shared),
# with debug assertions on (shape inference is checked against execution) and the seed corpus of the repository.
# New inputs go to fuzz/corpus/<target>/ (only the seed-* files are committed); findings to fuzz/artifacts/.
# Usage: [RUNS=N] fuzz/run.sh [SECONDS] [TARGET...] — each target stops after SECONDS or, with RUNS, N executions,
# whichever comes first; the final stats line (stat::number_of_executed_units) gives the count.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(idx idx_gzip safetensors onnx image_folder threat_model fuzz_config)
fi
for t in "${targets[@]}"; do
    echo "== $t: ${seconds}s"
    cargo +nightly fuzz run -a "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -runs="${RUNS:--1}" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
        -print_final_stats=1 2>&1 | grep -E "^(stat::|==|#[0-9]+ *DONE|.*(panicked|ERROR|SUMMARY|crash|leak|oom|timeout))" || true
done
