#!/bin/sh
# The WebSocket frame codec's fuzz (tests/ws/test_ws_frame_fuzz.py: the
# native codec against the Python model, frame by frame and message by
# message, the permessage-deflate inflate path against Python's zlib too),
# run for longer than the suite's bounded run, as fuzz_http.sh.
#
#   bench/fuzz_ws.sh [SECONDS] [--asan]
#
# SECONDS (default 600): rounds of EXAMPLES generated streams per test
# (default 5000; FUZZ_WS_EXAMPLES overrides), each with a new seed, until
# SECONDS have passed; the first failing round stops it. --asan runs each
# round under AddressSanitizer + UBSan (tests/ws/test_ws_asan.py).
set -eu
cd "$(dirname "$0")/.."
SECONDS_WANTED=${1:-600}
MODE=${2:-}
export FUZZ_WS_EXAMPLES=${FUZZ_WS_EXAMPLES:-5000}
export FUZZ_WS_TIMEOUT=${FUZZ_WS_TIMEOUT:-3600}
PY=.venv/bin/python
if [ "$MODE" = "--asan" ]; then
  TARGET=tests/ws/test_ws_asan.py
else
  TARGET=tests/ws/test_ws_frame_fuzz.py
fi
end=$(( $(date +%s) + SECONDS_WANTED ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  echo "round $round: $FUZZ_WS_EXAMPLES examples per test ($TARGET)"
  "$PY" -m pytest -q -p no:cacheprovider -p no:xdist "$TARGET" \
      --hypothesis-seed="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
done
echo "fuzz_ws: $round round(s), no failure"
