#!/usr/bin/env bash
# Every bench's --smoke in turn (the same code path as its figures, on the smallest sizes), each one's name,
# wall time and, for a comparison, which of its halves ran (bench/records.py `other_half`: the other half runs where its
# package is installed; GKD_SMOKE_REQUIRE makes a missing one fail), then the tables rendered from records
# (bench/records.py's, chaos_trials', bench_restart_load's, pipeline_trials', bench_ettr's) checked against them. Run from
# the repository root with the main venv active: `bash bench/smoke.sh` (CI runs it after the suite, with the bench extra
# installed and GKD_SMOKE_REQUIRE="trl textual_plotext"; vLLM's half in its own venv: .ci/run).
# A bench that fails does not stop the others; the script fails at the end, naming every one that did.
set -euo pipefail
cd "$(dirname "$0")/.."

# One GKD_HOME for them all: the benches that run the trainer link its cache, so the built-in teacher is
# trained once here rather than once per bench (and nothing is written under the user's ~/.gkd).
GKD_HOME="$(mktemp -d -t gkd-smoke-XXXXXX)"
export GKD_HOME
trap 'rm -rf "$GKD_HOME"' EXIT
mkdir -p "$GKD_HOME/cache"

# A smoke run is seconds to a minute; one still going after this is stuck, not slow.
LIMIT_S=600
failed=()
times=()
all_start=$(date +%s%N)
# (gpu_check.py checks NVML and CUDA on a GPU; on a machine without one it says so and exits 0)
for bench in bench/bench_*.py bench/chaos_trials.py bench/pipeline_trials.py bench/gpu_check.py; do
    name=$(basename "$bench" .py)
    echo "== $name --smoke"
    start=$(date +%s%N)
    rc=0
    timeout --kill-after=30 "$LIMIT_S" python "$bench" --smoke 2>&1 | tee "$GKD_HOME/smoke.log" || rc=${PIPESTATUS[0]}
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    line=$(printf '%-22s %6d.%01d s' "$name" $(( took / 1000 )) $(( took % 1000 / 100 )))
    halves=$(grep -m1 '^halves: ' "$GKD_HOME/smoke.log" | cut -d' ' -f2- || true)
    [[ -n "$halves" ]] && line="$line  halves: $halves"
    if (( rc != 0 )); then
        why="exit $rc"
        (( rc == 124 || rc == 137 )) && why="still running after $LIMIT_S s"
        line="$line  FAILED ($why)"
        failed+=("$name ($why)")
    fi
    times+=("$line")
    echo "== $line"
done
all=$(( ($(date +%s%N) - all_start) / 1000 ))

echo
echo "bench smoke runs, wall time each:"
printf '  %s\n' "${times[@]}"
printf '  %-22s %6d.%01d s\n' "all" $(( all / 1000000 )) $(( all % 1000000 / 100000 ))
if (( ${#failed[@]} )); then
    list=$(printf '%s, ' "${failed[@]}")
    echo "bench/smoke.sh: ${#failed[@]} bench(es) failed their --smoke: ${list%, }; each one's error is above" >&2
    exit 1
fi

echo "== the tables rendered from records, checked against them"
python bench/records.py --check
python bench/chaos_trials.py --render-only --check
python bench/bench_restart_load.py --render-only --check
python bench/pipeline_trials.py --render-only --check
python bench/bench_ettr.py --render-only --check
