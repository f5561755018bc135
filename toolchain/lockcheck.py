"""toolchain/lockcheck.py LOCK [--all]: is what this interpreter has installed what
the lock says?

Run by the Makefile after every set-up, with the venv's python, so a CI log shows
that the suite ran on exactly the locked versions (issue 34: a fresh machine got
msgspec 0.23, which nothing had tested, and 11 tests failed on its words).

Every installed distribution but sockherd itself must be in LOCK at the very
version installed; with --all (the test set-up, which installs all of it) every
locked one must be installed too. Prints one line per difference and exits 1 if
there is any; else one line saying how many matched. Only the standard library,
so it runs before anything is installed right.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str) -> dict[str, str]:
    pins = {}
    with open(path, encoding="utf-8") as lines:
        text = list(lines)
    for number, line in enumerate(text, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not match:
            sys.exit(f"lockcheck: {path}:{number}: not NAME==VERSION: {line!r}")
        pins[canonical(match[1])] = match[2]
    return pins


def installed() -> dict[str, str]:
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:                        # a half-removed distribution has none
            found[canonical(name)] = dist.version
    found.pop("sockherd", None)
    return found


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        sys.exit("usage: lockcheck.py LOCK [--all]")
    lock, have = read_lock(argv[0]), installed()
    wrong = [f"  {name} {version} installed, the lock says "
             + (lock[name] if name in lock else "nothing of it")
             for name, version in sorted(have.items()) if lock.get(name) != version]
    if "--all" in argv[1:]:
        wrong += [f"  {name} {version} locked, not installed"
                  for name, version in sorted(lock.items()) if name not in have]
    py = ".".join(map(str, sys.version_info[:3]))
    if wrong:
        print(f"lockcheck: Python {py}: what is installed is not {argv[0]}:", *wrong,
              sep="\n", file=sys.stderr)
        return 1
    print(f"lockcheck: Python {py}: {len(have)} distributions installed, each at the "
          f"version {argv[0]} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
