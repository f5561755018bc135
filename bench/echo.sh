#!/bin/sh
# bench/echo.sh: the stream echo benchmark of issue 20 in one command.
#
#   sh bench/echo.sh [--no-callgrind] [echo_bench.py options]
#                                   (from anywhere; ~4-6 min + ~5 min callgrind)
#
# sockherd's stream interface (`sockherd run echo:Echo --interface stream -w 2
# --threads 1`) against an asyncio echo server, a uvloop one (bench/asyncio_echo.py,
# 2 processes, SO_REUSEPORT) and a C epoll one (bench/c_echo_ref.c, 2
# processes, SO_REUSEPORT), in the same run, 2 rounds interleaved: a small load
# (50 connections, 64-byte ping-pong) and a bulk one (8 connections, 64 KiB
# messages), 1 s warm-up + 8 s counted per row, the client being
# bench/echo_pingpong.c (C, one epoll thread). Before each row it waits at
# most 10 s for the shared machine to be quiet (--row-wait). Prints a
# Markdown report for bench/RESULTS.md on stdout (progress on stderr):
# msgs/s and MiB/s, ratios to each peer, server CPU per message (from /proc),
# client CPU (is the client the limit?), the machine's load during each row.
# Exits 1 if a connection was lost or an echo mismatched.
#
# Then (unless --no-callgrind) bench/echo_callgrind.py: instructions per echo
# of each server's one serving process under callgrind (user space; one
# connection, 10,000 x 64 B and 1,000 x 64 KiB echoes), a figure the machine's
# load does not move: the one to compare before/after on a shared box. Its
# table follows the first on stdout.
#
# Needs sockherd's venv (`sh make.sh test`: .venv/bin/sockherd) and gcc; the
# peers' venv bench/.venv-peers (uvloop) is made by bench/setup_peers.sh, run
# here when uvloop is missing from it. Options given are passed on (and win
# over the defaults here), e.g.:
#   sh bench/echo.sh --rounds 1 --seconds 3 --loads small --only sockherd,uvloop
#   sh bench/echo.sh --client-threads 2      # is the client the limit?
# `.venv/bin/python bench/echo_bench.py --help` lists them all.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ ! -x .venv/bin/sockherd ]; then
    echo "echo.sh: .venv/bin/sockherd missing: run 'sh make.sh test' first" >&2
    exit 2
fi
if ! bench/.venv-peers/bin/python -c 'import uvloop' >/dev/null 2>&1; then
    sh bench/setup_peers.sh >&2
fi
callgrind=1
if [ "${1:-}" = "--no-callgrind" ]; then
    callgrind=0
    shift
fi
rc=0
.venv/bin/python bench/echo_bench.py --rounds 2 --row-wait 10 "$@" || rc=$?
if [ "$callgrind" = 1 ]; then
    echo
    .venv/bin/python bench/echo_callgrind.py || rc=$?
fi
exit "$rc"
