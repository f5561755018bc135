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
# round under AddressSanitizer + UBSan through tests/worker/test_http_asan.py
# (which also runs the other parser and engine files it lists; slower).
# Run from the checkout after `make setup` (or with .venv in place).
set -eu
cd "$(dirname "$0")/.."
SECONDS_WANTED=${1:-600}
MODE=${2:-}
export FUZZ_HTTP_EXAMPLES=${FUZZ_HTTP_EXAMPLES:-5000}
export FUZZ_HTTP_TIMEOUT=${FUZZ_HTTP_TIMEOUT:-3600}
PY=.venv/bin/python
if [ "$MODE" = "--asan" ]; then
  TARGET=tests/worker/test_http_asan.py
else
  TARGET=tests/worker/test_http_framing_fuzz.py
fi
end=$(( $(date +%s) + SECONDS_WANTED ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  echo "round $round: $FUZZ_HTTP_EXAMPLES examples per test ($TARGET)"
  # a fresh seed each round (hypothesis still replays a saved failing example first)
  "$PY" -m pytest -q -p no:cacheprovider -p no:xdist "$TARGET" \
      --hypothesis-seed="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
done
echo "fuzz_http: $round round(s), no failure"
