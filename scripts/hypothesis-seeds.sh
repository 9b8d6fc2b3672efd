#!/usr/bin/env bash
# Run every hypothesis test with N different seeds in a row (random exploration, the
# "dev" profile), and stop at the first seed that fails, printing how to reproduce it.
#
#   scripts/hypothesis-seeds.sh 20                 # seeds 1..20
#   scripts/hypothesis-seeds.sh 20 -x -k placement  # extra pytest arguments
#   FIRST_SEED=100 scripts/hypothesis-seeds.sh 5    # seeds 100..104
#   scripts/hypothesis-seeds.sh 20 -n 2 -m hypothesis  # only the @given tests, on 2 cores
#
# A seed changes nothing but the @given tests (Hypothesis marks each one `hypothesis`), so
# `-m hypothesis` leaves out the files' other tests, which a seed cannot change (88 of
# 293 tests are @given tests; most of the others start servers and CLI processes).
#
# CI runs derandomised (tests/conftest.py), so a property that holds only for
# the examples CI happens to draw would stay hidden there; this is the run to
# make before calling a property safe. The schemathesis module is left out: it
# is derandomised on purpose and a seed does not change what it sends.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:?usage: scripts/hypothesis-seeds.sh N [pytest args...]}
shift
first=${FIRST_SEED:-1}
mapfile -t files < <(grep -l "^from hypothesis import" -r tests --include='test_*.py' \
  | grep -v "tests/api/test_api_fuzz.py" | sort)
unset CI
export HYPOTHESIS_PROFILE=dev
for ((seed = first; seed < first + count; seed++)); do
  started=$(date +%s)
  if ! .venv/bin/pytest -q --hypothesis-seed="$seed" "${files[@]}" "$@" \
      > ".hypothesis-seed.log" 2>&1; then
    tail -n 60 .hypothesis-seed.log
    echo "seed $seed FAILED; reproduce: HYPOTHESIS_PROFILE=dev .venv/bin/pytest --hypothesis-seed=$seed ${files[*]}" >&2
    exit 1
  fi
  echo "seed $seed: $(tail -n 1 .hypothesis-seed.log) ($(($(date +%s) - started)) s)"
done
echo "all $count seeds passed (${first}..$((first + count - 1)))"
