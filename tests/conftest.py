"""Shared fixtures. Every process a test spawns is reaped here whatever happens."""

import os

# Masters the tests start reload without probation (the old generation drains
# at the commit, `ctl reload` answers then), unless a test asks for one: the
# reload tests pin down what happens up to the commit, and 10 s of probation
# on each of their reloads would add minutes to the suite. Probation itself
# is pinned down by tests/master/test_reload_probation.py, which sets it.
os.environ.setdefault("SOCKHERD_RELOAD_PROBATION", "0")
