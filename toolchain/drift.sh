#!/bin/sh
# toolchain/drift.sh PYTHON [--lock-only]   (make drift, make lock)
#
# The suite on the newest releases of every dependency: a scratch venv
# (.venv-drift) gets `pip install '.[test]'` with no lock, the report says which
# versions differ from requirements/lock.txt, then the whole suite runs there.
# A release that breaks us shows up here, on purpose, as a report
# (drift-report.txt) instead of as a red CI on a fresh machine weeks later.
# --lock-only writes requirements/lock.txt from that venv and runs nothing:
# `make lock`, after a drift run passed.
#
# sockherd is installed into the scratch venv as a wheel, not editable, so
# its compiled extensions stay apart from the .venv's in the checkout.
set -eu
cd "$(dirname "$0")/.."
PY=${1:-python3}
mode=${2:-}
venv=.venv-drift
lock=requirements/lock.txt
report=drift-report.txt

rm -rf "$venv"
"$PY" -m venv "$venv"
# no constraint at all: neither the lock nor a machine-wide pip constraint
export PIP_CONSTRAINT=
"$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$venv/bin/python" -m pip install -q '.[test]'
"$venv/bin/python" -m pip freeze --all --exclude sockherd | sort -f >"$venv/freeze.txt"

if [ "$mode" = "--lock-only" ]; then
	{
		sed -n '/^# runtime and test stack/q;p' "$lock"
		grep -i -E '^(pip|setuptools|wheel)==' "$venv/freeze.txt"
		echo "# runtime and test stack (pip freeze of a venv the suite passed in)"
		grep -v -i -E '^(pip|setuptools|wheel)==' "$venv/freeze.txt"
	} >"$lock.new"
	mv "$lock.new" "$lock"
	echo "drift.sh: $lock renewed from the newest releases; run make test, then commit"
	exit 0
fi

# both files read by lockcheck's own parser (NAME==VERSION lines, names canonical)
"$venv/bin/python" - "$lock" "$venv/freeze.txt" >"$report" <<'PY'
import sys
sys.path.insert(0, "toolchain")
from lockcheck import read_lock
lock, new = read_lock(sys.argv[1]), read_lock(sys.argv[2])
names = sorted(set(lock) | set(new))
rows = [(n, lock.get(n, "-"), new.get(n, "-")) for n in names if lock.get(n) != new.get(n)]
print(f"# drift: the newest releases against {sys.argv[1]}")
print(f"{len(rows)} of {len(names)} distributions differ from the lock")
print(f"{'distribution':28} {'locked':14} newest")
for name, old, newer in rows:
    print(f"{name:28} {old:14} {newer}")
PY
cat "$report"
echo "drift.sh: the suite on those versions (pytest -n auto)..."
set +e
# tests/test_package.py pins the editable layout (each sockherd.X maps onto
# the checkout's folder X), which this wheel install leaves out on purpose
"$venv/bin/python" -m pytest -n auto -q -p no:cacheprovider \
	--deselect tests/test_package.py::test_subpackage_maps_to_top_level_folder \
	>"$venv/pytest.log" 2>&1
rc=$?
set -e
{
	echo
	echo "# the suite on the newest releases: exit $rc"
	grep -E '^(FAILED|ERROR) ' "$venv/pytest.log" | sed 's/ - .*//' | sort | uniq | head -60
	tail -1 "$venv/pytest.log"
} >>"$report"
tail -n +2 "$report" | sed -n '/^# the suite/,$p'
echo "drift.sh: the report is $report, pytest's whole output $venv/pytest.log"
exit $rc
