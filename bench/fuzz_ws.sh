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
# round under AddressSanitizer + UBSan (tests/ws/test_ws_asan.py: the codec's
# fixed cases and the protocol's too, around the fuzz), EXAMPLES 1000 unless
# set; the round's seed reaches the sanitized child (FUZZ_SEED) and is
# printed, as fuzz_http.sh does.
set -eu
cd "$(dirname "$0")/.."
SECONDS_WANTED=${1:-600}
MODE=${2:-}
if [ "$MODE" = "--asan" ]; then
  export FUZZ_WS_EXAMPLES=${FUZZ_WS_EXAMPLES:-1000}
  TARGET=tests/ws/test_ws_asan.py
else
  export FUZZ_WS_EXAMPLES=${FUZZ_WS_EXAMPLES:-5000}
  TARGET=tests/ws/test_ws_frame_fuzz.py
fi
export FUZZ_WS_TIMEOUT=${FUZZ_WS_TIMEOUT:-3600}
PY=.venv/bin/python
end=$(( $(date +%s) + SECONDS_WANTED ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  seed=${FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
  echo "round $round: $FUZZ_WS_EXAMPLES examples per test ($TARGET), seed $seed"
  start=$(date +%s)
  FUZZ_SEED=$seed "$PY" -m pytest -q -p no:cacheprovider -p no:xdist "$TARGET" \
      --hypothesis-seed="$seed"
  echo "round $round: passed in $(( $(date +%s) - start )) s"
done
echo "fuzz_ws: $round round(s), no failure"
