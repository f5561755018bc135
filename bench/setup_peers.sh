#!/bin/sh
# Installs what the issue-7 benchmarks (accept_bench, idle_bench, echo_bench),
# issue 8's http_hello and issue 9's reload_under_load need besides sockherd
# itself, and only what is missing:
#   Debian: nginx (nginx-light, else nginx), wrk, gcc, haproxy (reload_under_load:
#   its master-worker mode, -W, reloaded by SIGUSR2)
#   bench/.venv-peers: gunicorn uvicorn granian uvloop httptools fastapi
#   gunicorn_h1c websockets (a venv of its own, so the peers never touch sockherd's .venv;
#   httptools: uvicorn --http httptools in http_hello; fastapi: asgi_hello's
#   FastAPI JSON app; gunicorn_h1c: the C parser gunicorn's asgi worker uses
#   when present, `gunicorn[fast]`; websockets: uvicorn's WebSocket implementation,
#   issue 23's ws_echo and ws_conformance)
# Idempotent: a second run installs nothing and exits 0.
# sockherd's own venv (.venv, the sockherd binary) comes from `sh make.sh test`.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$HERE/.venv-peers"
PY=${PYTHON:-python3}

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=""
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$missing nginx"
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v gcc >/dev/null 2>&1 || missing="$missing gcc"
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing="$missing haproxy"
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then missing="$missing python3-venv"; fi

if [ -n "$missing" ]; then
    echo "setup_peers: installing Debian packages:$missing"
    $SUDO apt-get update
    for p in $missing; do
        case "$p" in
        nginx)
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y nginx-light \
                || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y nginx ;;
        *)
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "$p" ;;
        esac
    done
    # the packaged nginx and haproxy services are not wanted: the benchmarks run
    # their own instances with a conf of their own (systemd may not be running)
    if command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl disable --now nginx >/dev/null 2>&1 || true
        $SUDO systemctl disable --now haproxy >/dev/null 2>&1 || true
    fi
    for pidfile in /run/nginx.pid /run/haproxy.pid; do
        if [ -f "$pidfile" ]; then
            $SUDO kill "$(cat "$pidfile")" 2>/dev/null || true
        fi
    done
else
    echo "setup_peers: Debian packages present (nginx wrk gcc haproxy)"
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_peers: creating $VENV"
    "$PY" -m venv "$VENV"
fi

need=""
for m in gunicorn uvicorn granian uvloop httptools fastapi gunicorn_h1c websockets; do
    "$VENV/bin/python" -c "import $m" >/dev/null 2>&1 || need="$need $m"
done
if [ -n "$need" ]; then
    echo "setup_peers: pip install$need"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q $need
else
    echo "setup_peers: $VENV has gunicorn uvicorn granian uvloop httptools fastapi gunicorn_h1c websockets"
fi
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
print("setup_peers: " + " ".join(f"{p}=={md.version(p)}" for p in
      ("gunicorn", "uvicorn", "granian", "uvloop", "httptools", "fastapi", "gunicorn_h1c",
       "websockets")))
EOF
