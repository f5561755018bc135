#!/bin/sh
# cpu_ab.sh: one app served by two sockherd trees, measured in turns, for a
# same-run before/after of a change on the request path: req/s and, per
# request, the workers' user and system CPU, the client's (wrk's) CPU and
# context switches. Where a change moves CPU between the server, the
# kernel and the client (wake-ups), req/s alone hides it.
#
#   sh bench/cpu_ab.sh BASE_DIR CHANGE_DIR [APP] [PAIRS] [SECONDS]
#
# BASE_DIR, CHANGE_DIR: checkouts with their own .venv (pip install -e .);
# APP: bench/apps' module:attr (default fastapi_json:app, run with
# --interface asgi; hello:app runs as WSGI); PAIRS turns of base then change
# (3); SECONDS of wrk -t2 -c50 keep-alive per row (8), after a 2 s warm-up.
# Each row: `sockherd run APP -w 2 --threads 1`, workers' utime/stime from
# /proc/PID/stat before and after, wrk under `perf stat -e
# task-clock,context-switches` (software events: no PMU needed). Needs wrk
# and perf (bench/setup_peers.sh installs wrk; perf: Debian linux-perf).
set -eu
base=$1; change=$2; app=${3:-fastapi_json:app}; pairs=${4:-3}; secs=${5:-8}
here=$(cd "$(dirname "$0")" && pwd)
case $app in fastapi_json:*|*:asgi) iface="--interface asgi" ;; *) iface="" ;; esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

cpu() {  # utime stime summed over the server's processes (pids in $1)
	for p in $1; do cat /proc/$p/stat 2>/dev/null; done | awk '{u+=$14; s+=$15} END {print u+0, s+0}'
}

row() {  # row NAME TREE
	cd "$here/apps"
	"$2/.venv/bin/sockherd" run $app $iface -w 2 --threads 1 --bind 127.0.0.1:$port --control off \
		> "$tmp/$1.log" 2>&1 &
	srv=$!
	i=0
	until curl -s -o /dev/null "http://127.0.0.1:$port/"; do
		i=$((i + 1)); [ $i -lt 150 ] || { echo "$1: no answer on $port" >&2; kill $srv; exit 1; }
		sleep 0.2
	done
	wrk -t2 -c50 -d2 "http://127.0.0.1:$port/" > /dev/null
	pids="$srv $(pgrep -P $srv | tr '\n' ' ')"
	b=$(cpu "$pids")
	perf stat -x, -e task-clock,context-switches wrk -t2 -c50 -d"$secs" \
		"http://127.0.0.1:$port/" > "$tmp/wrk" 2> "$tmp/perf"
	a=$(cpu "$pids")
	kill -TERM $srv; wait $srv || true
	python3 - "$1" "$b" "$a" "$tmp/wrk" "$tmp/perf" <<'PY'
import os, re, sys
name, b, a, wrk, perf = sys.argv[1:]
text = open(wrk).read()
n = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
errs = re.search(r"Non-2xx[^\n]*|Socket errors[^\n]*", text)
tick = 1e6 / os.sysconf("SC_CLK_TCK")
(ub, sb), (ua, sa) = map(int, b.split()), map(int, a.split())
ev = {l.split(",")[2]: float(l.split(",")[0]) for l in open(perf) if l.count(",") > 2 and l[0].isdigit()}
print(f"{name:7s} {rps:9.0f} req/s  workers user {(ua - ub) * tick / n:5.1f} us  sys {(sa - sb) * tick / n:5.1f} us"
      f"  wrk {ev['task-clock'] * 1e3 / n:5.1f} us  wrk cs {ev['context-switches'] / n:.2f}"
      f"  load {os.getloadavg()[0]:.2f}" + (f"  {errs.group(0)}" if errs else ""))
PY
}

echo "# cpu_ab: $app, base $base ($(git -C "$base" log -1 --format=%h)), change $change ($(git -C "$change" log -1 --format=%h)); $(date -u '+%F %T') UTC; $(nproc) CPUs"
p=0
while [ $p -lt "$pairs" ]; do
	row base "$base"; row change "$change"; p=$((p + 1))
done
