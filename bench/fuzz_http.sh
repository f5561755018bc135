#!/bin/sh
# The request-path fuzz target (tests/worker/test_http_framing_fuzz.py: the
# engine framed against the strict reference, on the Parser and on sockets),
# run for longer than the suite's bounded run.
#
#   bench/fuzz_http.sh [SECONDS] [--asan]
#
# SECONDS (default 600): rounds of EXAMPLES generated streams per test
# (default 5000; FUZZ_HTTP_EXAMPLES overrides), each round with a new random
# seed, until SECONDS have passed; the first failing round stops it and its
# output (the shrunk failing input) is left in the terminal. --asan runs each
# round under AddressSanitizer + UBSan through tests/worker/test_http_asan.py's
# "fuzz" part only (test_engine_fuzz.py, test_http_framing_fuzz.py and its
# known cases, test_http_pipeline_eof.py: its other parts are the suite's
# fixed cases, nothing a new seed changes), EXAMPLES 1000 unless set (an
# ASan round is ~5x slower). The round's seed reaches the sanitized child
# (FUZZ_SEED, tests/http_asan.py) and is printed: a failing round replays
# with `FUZZ_SEED=N bench/fuzz_http.sh 1 --asan`. Each round prints its
# seconds. Run from the checkout after `make setup` (or with .venv in place).
set -eu
cd "$(dirname "$0")/.."
SECONDS_WANTED=${1:-600}
MODE=${2:-}
if [ "$MODE" = "--asan" ]; then
  export FUZZ_HTTP_EXAMPLES=${FUZZ_HTTP_EXAMPLES:-1000}
  TARGET=tests/worker/test_http_asan.py
  SELECT="fuzz"                       # the part of PARTS that generates inputs
else
  export FUZZ_HTTP_EXAMPLES=${FUZZ_HTTP_EXAMPLES:-5000}
  TARGET=tests/worker/test_http_framing_fuzz.py
  SELECT=""
fi
export FUZZ_HTTP_TIMEOUT=${FUZZ_HTTP_TIMEOUT:-3600}
PY=.venv/bin/python
end=$(( $(date +%s) + SECONDS_WANTED ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  # a fresh seed each round unless given (hypothesis still replays a saved
  # failing example first)
  seed=${FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
  echo "round $round: $FUZZ_HTTP_EXAMPLES examples per test ($TARGET${SELECT:+ -k $SELECT}), seed $seed"
  start=$(date +%s)
  FUZZ_SEED=$seed "$PY" -m pytest -q -p no:cacheprovider -p no:xdist "$TARGET" \
      ${SELECT:+-k "$SELECT"} --hypothesis-seed="$seed"
  echo "round $round: passed in $(( $(date +%s) - start )) s"
done
echo "fuzz_http: $round round(s), no failure"
