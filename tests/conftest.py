"""Shared fixtures. Every process a test spawns is reaped here whatever happens."""

import os

# Masters the tests start reload without probation (the old generation drains
# at the commit, `ctl reload` answers then), unless a test asks for one: the
# reload tests pin down what happens up to the commit, and 10 s of probation
# on each of their reloads would add minutes to the suite. Probation itself
# is pinned down by tests/master/test_reload_probation.py, which sets it.
os.environ.setdefault("SOCKHERD_RELOAD_PROBATION", "0")

import pytest  # noqa: E402

from shared_builds import build_once, run_dir  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked `long` (about 20 s or more of one worker: the sanitizer
    builds' child runs, the mutants, the wheel, the callgrind benches, the
    reload-under-load tests) run first, in collection order; the rest keep
    theirs. xdist hands its first tests out round
    robin and the rest to whichever worker is free: with the long ones
    first they overlap the many short ones instead of starting last and
    leaving one worker alone with them at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.hookimpl(optionalhook=True)      # the ASan children run pytest -p no:xdist
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's `make test`, CI): two xdist workers per
    core. Most of the suite's time is waiting (servers starting, drains,
    reload timers), not CPU: tests/master + tests/asgi, back to back at
    load 18-20 on the 2-core box, took 528 s at -n 2 and 408 s at -n 4 for
    the same CPU (268 and 258 s user+sys, children included), green at
    -n 4 (docs/test-suite-time.md). PYTEST_XDIST_AUTO_NUM_WORKERS still
    overrides, as in xdist's own hook."""
    forced = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if forced and forced.isdigit():
        return int(forced)
    return 2 * len(os.sched_getaffinity(0))


@pytest.fixture(scope="session")
def shared_build(tmp_path_factory, pytestconfig):
    """shared_build(name, key, build) -> Path: the artefact `name` of the
    build named `key` (shared_builds.digest), made by build(out) once per
    test run and reused by every test and xdist worker that asks for the
    same key (tests/shared_builds.py)."""
    root = run_dir(tmp_path_factory.getbasetemp(), hasattr(pytestconfig, "workerinput"))
    return lambda name, key, build: build_once(root, name, key, build)


@pytest.fixture(scope="session")
def http_asan_env(shared_build):
    """The environment of a child interpreter that runs the native HTTP
    extension's AddressSanitizer + UBSan build (tests/http_asan.py),
    compiled once per test run."""
    import http_asan
    return http_asan.child_env(shared_build(http_asan.SO_NAME, http_asan.build_key(),
                                            http_asan.build))
