# Two commands on a fresh Debian machine with Python 3.11 (as root):
#   make run    set up, then launch sockherd: the embedded status page on :8000
#   make test   set up, then run the whole suite (C sanitizer tests included)
# The README says `sh make.sh run|test`: the same, after installing make on a
# machine that lacks it.
# "Set up" installs only what is missing: Debian packages (libcap-dev for
# python-prctl, a C compiler and Python headers for the cffi core and the HTTP
# extension, node-llhttp for the llhttp C sources it compiles in, libssl-dev for
# the engine's TLS (OpenSSL), zlib1g-dev for WebSocket per-message deflate,
# systemd for
# systemd-socket-activate), then .venv and `pip install -e .` (runtime
# dependencies only) for `make run`, `pip install -e '.[test]'` for `make
# test`, which also installs chromium and chromium-driver (the browser test).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
SOURCES := pyproject.toml setup.py fdcore/_build.py $(wildcard fdcore/*.c fdcore/*.h worker/native/*.c worker/native/*.h worker/aio_native/*.c ipc/native/*.c)
DEBS   := libcap-dev gcc python3-dev python3-venv systemd node-llhttp libssl-dev zlib1g-dev
# only for `make test`: the status page's browser test (tests/master/
# test_status_page.py) drives a headless Chromium through chromedriver; the
# multi-host proof (tests/deploy/test_multihost.py) runs HAProxy in network
# namespaces (ip netns). Not fatal when apt cannot get them: those tests are
# then skipped and say why.
TEST_DEBS := chromium chromium-driver haproxy iproute2 openssl curl

.PHONY: setup run test clean debs test-debs

setup: $(STAMP)

test-debs:
	@missing=""; \
	for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the tests:$$missing"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; } \
	    || echo "could not install$$missing: the browser test will be skipped"; \
	fi

debs:
	@missing=""; \
	for p in $(DEBS); do \
	  case $$p in \
	    python3-dev)  $(PYTHON) -c 'import sysconfig,os,sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"],"Python.h")))' || missing="$$missing $$p";; \
	    python3-venv) $(PYTHON) -c 'import ensurepip' 2>/dev/null || missing="$$missing $$p";; \
	    gcc)          command -v gcc >/dev/null || missing="$$missing $$p";; \
	    systemd)      command -v systemd-socket-activate >/dev/null || missing="$$missing $$p";; \
	    *)            dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p";; \
	  esac; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# run: the runtime only; test: the test stack too (a `make run` first does
# not stand for it: its own stamp)
$(STAMP): $(SOURCES)
	@$(MAKE) --no-print-directory debs
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(TSTAMP): $(SOURCES)
	@$(MAKE) --no-print-directory debs
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@ $(STAMP)

run: setup
	@echo "sockherd: the embedded status page on http://127.0.0.1:8000/ (Ctrl-C stops)"
	$(BIN)/sockherd run

# --durations: every CI log ends with the 25 slowest test phases, so the next
# cut of the suite's time starts from figures (docs/test-suite-time.md)
test: $(TSTAMP) test-debs
	$(BIN)/python -m pytest -n auto --durations=25

clean:
	rm -rf $(VENV) build *.egg-info fdcore/_fdcore*.so fdcore/_fdcore.c tests/c/build
