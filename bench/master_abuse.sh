#!/bin/sh
# Issue 19's abuses of a live master, measured (bench/master_abuse.py).
#   bench/master_abuse.sh [PATH_TO_CHECKOUT] [--only 1,2,...] [--json FILE] [--keep DIR]
# The checkout (default: this one) is run with its own .venv, made with
# `pip install -e` if it has none. Prints one line per abuse, then a
# Markdown block for bench/RESULTS.md.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
checkout=$(dirname "$here")
case "${1:-}" in
  ""|-*) ;;
  *) checkout=$(cd "$1" && pwd); shift ;;
esac
py="$checkout/.venv/bin/python"
if [ ! -x "$py" ]; then
  echo "making $checkout/.venv (pip install -e)" >&2
  python3 -m venv "$checkout/.venv"
  "$py" -m pip install -q -e "$checkout"
fi
exec "$py" "$here/master_abuse.py" "$@"
