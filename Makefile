# Two commands on a fresh Debian machine with Python 3.11 (as root):
#   make run    set up, then launch sockherd: the embedded status page on :8000
#   make test   set up, then run the whole suite on 3.11, then the engine,
#               ASGI, WSGI, WebSocket, TLS and master parts on CPython 3.13
# The README says `sh make.sh run|test`: the same, after installing make on a
# machine that lacks it.
# "Set up" installs only what is missing: Debian packages (libcap-dev for
# python-prctl, a C compiler and Python headers for the cffi core and the HTTP
# extension, node-llhttp for the llhttp C sources it compiles in, libssl-dev for
# the engine's TLS (OpenSSL), zlib1g-dev for WebSocket per-message deflate,
# systemd for systemd-socket-activate), then .venv and `pip install -e .`
# (runtime dependencies only) for `make run`, `pip install -e '.[test]'` for
# `make test`, which also installs chromium and chromium-driver (the browser
# test). Every pip install goes through requirements/lock.txt (the versions
# the suite passed with), and toolchain/lockcheck.py checks the result.
# CPython 3.13 is built once from Debian's source package into $(CACHE)
# (toolchain/cpython.sh, ~8 min on 2 cores) and reused by every later clone.
# Other targets: `make drift` (the suite on the newest releases, in a scratch
# venv: docs/dependencies.md), `make lock` (renew the lock from them),
# `make test311` / `make test313` (one interpreter's part alone).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
LOCK   := requirements/lock.txt
# pip through the lock: -c for what is asked for, PIP_CONSTRAINT for the
# isolated build environment's setuptools/wheel/cffi too
PIPI    = PIP_CONSTRAINT=$(CURDIR)/$(LOCK) $(1)/python -m pip install -q -c $(LOCK)
CACHE  ?= /var/cache/sockherd
PY313  := $(CACHE)/cpython-3.13/bin/python3.13
VENV13 := .venv313
SOURCES := $(LOCK) pyproject.toml setup.py fdcore/_build.py $(wildcard fdcore/*.c fdcore/*.h worker/native/*.c worker/native/*.h worker/native/*/*.c worker/native/*/*.h worker/native/*/*/*.c worker/native/*/*/*.h worker/native/layers.py worker/aio_native/*.c ipc/native/*.c)
DEBS   := libcap-dev gcc python3-dev python3-venv systemd node-llhttp libssl-dev zlib1g-dev
# only for `make test`: the status page's browser test (tests/master/
# test_status_page.py) drives a headless Chromium through chromedriver; the
# multi-host proof (tests/deploy/test_multihost.py) runs HAProxy in network
# namespaces (ip netns). Not fatal when apt cannot get them: those tests are
# then skipped and say why.
TEST_DEBS := chromium chromium-driver haproxy iproute2 openssl curl

.PHONY: setup run test test311 test313 drift lock clean debs test-debs

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

# A venv set up through the lock: $(call venv_setup,PYTHON,VENV,WHAT,CHECK)
# makes VENV with PYTHON if it is missing, installs WHAT (pip's argument)
# through the lock and runs lockcheck with CHECK (--all where WHAT is all
# of it)
define venv_setup
	@$(MAKE) --no-print-directory debs
	@[ -x $(2)/bin/python ] || $(1) -m venv $(2)
	$(call PIPI,$(2)/bin) pip setuptools wheel
	$(call PIPI,$(2)/bin) $(3)
	$(2)/bin/python toolchain/lockcheck.py $(LOCK) $(4)
endef

# run: the runtime only; test: the test stack too (a `make run` first does
# not stand for it: its own stamp)
$(STAMP): $(SOURCES)
	$(call venv_setup,$(PYTHON),$(VENV),-e .,)
	@touch $@

$(TSTAMP): $(SOURCES)
	$(call venv_setup,$(PYTHON),$(VENV),-e '.[test]',--all)
	@touch $@ $(STAMP)

# CPython 3.13 from Debian's source package, built once per machine
$(PY313):
	sh toolchain/cpython.sh $(CACHE)/cpython-3.13

$(VENV13)/.installed-test: $(SOURCES) | $(PY313)
	$(call venv_setup,$(PY313),$(VENV13),-e '.[test]',--all)
	@touch $@

run: setup
	@echo "sockherd: the embedded status page on http://127.0.0.1:8000/ (Ctrl-C stops)"
	$(BIN)/sockherd run

# --durations: every CI log ends with the 25 slowest test phases, so the next
# cut of the suite's time starts from figures (docs/test-suite-time.md)
test: test311 test313

test311: $(TSTAMP) test-debs
	$(BIN)/python -m pytest -n auto --durations=25

# On 3.13: everything that runs Python code of ours (engine, WSGI, ASGI,
# WebSocket, TLS, PROXY, master, ipc, fdcore, the wheel), less what does not
# depend on the interpreter or is a benchmark: the C-only sanitizer and
# mutation suites and the bench checks (README "Python versions").
test313: $(VENV13)/.installed-test test-debs
	$(VENV13)/bin/python -m pytest -n auto --durations=10 \
	  --ignore=tests/test_c_sanitizers.py --ignore=tests/test_c_mutations.py \
	  --ignore-glob='tests/test_bench_*'

# The suite on the newest releases of every dependency, in a scratch venv, so a
# breaking release shows up here as a report before it reaches a fresh machine
# (docs/dependencies.md). Not part of `make test`.
drift: setup
	sh toolchain/drift.sh $(PYTHON)

# Renew the lock from the newest releases (after `make drift` passed on them)
lock:
	sh toolchain/drift.sh $(PYTHON) --lock-only

clean:
	rm -rf $(VENV) $(VENV13) .venv-drift build *.egg-info fdcore/_fdcore*.so fdcore/_fdcore.c tests/c/build
