#!/bin/sh
# Usage (from anywhere): sh bench/hello_ab.sh CHECKOUT PORT; alternate it over two checkouts
# (a worktree of the base beside this one) for a same-run before/after of the hello path,
# without the peers (bench/http_hello.py needs bench/setup_peers.sh first).
# one round: sockherd -w 2 hello under wrk -t1 -c50 -d5s, from checkout $1, port $2
co=$1; port=$2
cd "$co" && .venv/bin/sockherd run hello:app --pythonpath bench/apps -w 2 -b 127.0.0.1:$port --runtime-dir "$(mktemp -d)" > /dev/null 2>&1 &
pid=$!
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:$port/ && break; sleep 0.1; done
wrk -t1 -c50 -d1s http://127.0.0.1:$port/ > /dev/null
echo "$(basename $co) $(wrk -t1 -c50 -d5s http://127.0.0.1:$port/ | grep -E 'Requests/sec')"
kill -TERM $pid; wait $pid
