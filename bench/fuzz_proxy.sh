#!/bin/sh
# The PROXY protocol fuzz target (tests/worker/test_proxy_protocol_fuzz.py:
# worker/native/parse/proxy_proto.c against the strict Python reference
# tests/worker/proxy_reference.py, on generated, mutated and garbage
# headers, every prefix, every mode: same verdict, same header length, same
# addresses and TLVs), run for longer than the suite's bounded run.
#
#   bench/fuzz_proxy.sh [SECONDS] [--asan]
#
# SECONDS (default 600): rounds of EXAMPLES generated inputs per test
# (default 5000; FUZZ_PROXY_EXAMPLES overrides), each round with a new random
# seed, until SECONDS have passed; the first failing round stops it with its
# shrunk failing input in the terminal. --asan runs each round under
# AddressSanitizer + UBSan through tests/worker/test_proxy_protocol_asan.py
# (with the PROXY socket tests, HTTP and stream). Run from the checkout
# after `make setup` (or with .venv in place).
set -eu
cd "$(dirname "$0")/.."
SECONDS_WANTED=${1:-600}
MODE=${2:-}
export FUZZ_PROXY_EXAMPLES=${FUZZ_PROXY_EXAMPLES:-5000}
export FUZZ_PROXY_TIMEOUT=${FUZZ_PROXY_TIMEOUT:-3600}
PY=.venv/bin/python
if [ "$MODE" = "--asan" ]; then
  TARGET=tests/worker/test_proxy_protocol_asan.py
else
  TARGET=tests/worker/test_proxy_protocol_fuzz.py
fi
end=$(( $(date +%s) + SECONDS_WANTED ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  echo "round $round: $FUZZ_PROXY_EXAMPLES examples per test ($TARGET)"
  "$PY" -m pytest -q -p no:cacheprovider -p no:xdist "$TARGET" \
      --hypothesis-seed="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
done
echo "fuzz_proxy: $round round(s), no failure"
