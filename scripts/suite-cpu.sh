#!/usr/bin/env bash
# Where the suite's CPU goes: the whole suite (as `make pytest` runs it) in a cgroup of
# its own, each xdist worker in a child cgroup, and each test's CPU with every process it
# started (scripts/suite_cpu.py). Prints the suite's CPU, its wall time and how busy it
# kept the cores, then the CPU by area, by module and the costliest tests.
#
#   sudo scripts/suite-cpu.sh                # the suite as make pytest runs it (-n 6)
#   sudo scripts/suite-cpu.sh -n 4           # other pytest arguments replace -n 6
#   scripts/suite-cpu.sh --report FILE       # the summary of an earlier run's log
#
# Needs write access to the cgroup v1 cpuacct hierarchy (root), Linux only. CPU, not wall
# time: other work on the machine moves it little, so a change is judged by it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--report" ]; then
	exec .venv/bin/python scripts/suite_cpu_report.py "$2"
fi
root=/sys/fs/cgroup/cpuacct/llmgw-suite-$$
log=${SUITE_CPU_LOG:-/tmp/llmgw-suite-cpu-$$.jsonl}
mkdir "$root"
: > "$log"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-n 6)
start=$(date +%s.%N)
set +e
(
	echo $BASHPID > "$root/cgroup.procs"
	.venv/bin/python -m compileall -q catalog events scheduler declared llmgw agent gateway \
		httpguard autoscale engine_check tests bench docsite > /dev/null
	env -u PYTHONDONTWRITEBYTECODE SUITE_CPU_CGROUP="$root" SUITE_CPU_LOG="$log" \
		PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" \
		.venv/bin/pytest -p suite_cpu --dist loadgroup -q "${args[@]}"
)
status=$?
set -e
wall=$(echo "$(date +%s.%N) - $start" | bc)
cpu=$(awk '{printf "%.1f", $1 / 1e9}' "$root/cpuacct.usage")
echo "==> suite: ${cpu} s of CPU in ${wall%.*} s (exit status $status); log: $log"
.venv/bin/python scripts/suite_cpu_report.py "$log" "$cpu" "$wall" "$(nproc)"
rmdir "$root"/* "$root" 2>/dev/null || true
exit $status
