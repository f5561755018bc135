#!/bin/sh
# toolchain/cpython.sh PREFIX [CONFIGURE-FLAG ...]
#
# Builds CPython 3.13 from Debian's source package (trixie's python3.13) into
# PREFIX, unless PREFIX already holds a working one: the Makefile calls it
# with a cache folder outside the checkout (/var/cache/sockherd by default),
# so a machine builds it once (7.7 min measured on 2 cores) and every later clone,
# CI's included, reuses it. Extra arguments go to ./configure (issue 39's
# free-threaded build passes --disable-gil into a second prefix).
#
# Why Debian's source and not python.org's: the machine reaches Debian's
# archive and PyPI only, and Debian's package is what a Debian 13 user runs.
# Only a deb-src entry is added: no binary package comes from trixie.
# Run as root (apt-get); prints what it does, exits non-zero on any failure.
set -eu
VER=3.13
prefix=$1; shift
py="$prefix/bin/python$VER"

# what the suite needs of the interpreter: TLS, zlib (pip, deflate), ctypes
# (cffi's ABI mode), sqlite3/bz2/lzma (test dependencies import them), venv
check() {
	[ -x "$py" ] && "$py" -c 'import ssl, zlib, ctypes, sqlite3, bz2, lzma, ensurepip, venv' 2>/dev/null
}
if check; then
	echo "cpython.sh: $("$py" -VV | head -1) in $prefix (cached)"
	exit 0
fi

work="$prefix.build"
rm -rf "$work"
mkdir -p "$work"

# A deb-src stanza for trixie with the mirror this machine's bookworm
# entries already use (read from apt's own configuration, so no host is
# named here).
list=/etc/apt/sources.list.d/sockherd-trixie-src.sources
if [ ! -e "$list" ]; then
	uri=$(awk '
		/^URIs:/ {u=$0; sub(/^URIs: */, "", u)}
		/^Suites:/ {s=$0; sub(/^Suites: */, "", s)}
		/^$/ { if (s ~ /(^| )bookworm( |$)/ && u != "") {print u; exit} ; u=""; s="" }
		END { if (s ~ /(^| )bookworm( |$)/ && u != "") print u }' \
		/etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
	if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
		uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list)
	fi
	[ -n "$uri" ] || { echo "cpython.sh: no bookworm entry in apt's sources to derive trixie's from" >&2; exit 1; }
	printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$uri" >"$list"
	echo "cpython.sh: added $list (deb-src trixie, $uri)"
fi

deps="dpkg-dev gcc make pkg-config libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev uuid-dev libncurses-dev libgdbm-dev"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $deps >/dev/null

cd "$work"
# Debian's patches are left out (--skip-patches): they disable ensurepip
# (so `python -m venv` makes no pip) and move site-packages to Debian's
# dist-packages layout, both for a system python managed by dpkg. What is
# built is upstream's source exactly as Debian's package ships it.
apt-get source -qq --download-only "python$VER" >source.log 2>&1 || { cat source.log >&2; exit 1; }
dpkg-source -x --skip-patches python"$VER"_*.dsc >>source.log 2>&1 || { cat source.log >&2; exit 1; }
src=$(find . -maxdepth 1 -type d -name "python$VER-*" | head -1)
[ -n "$src" ] || { echo "cpython.sh: apt-get source python$VER unpacked nothing" >&2; exit 1; }
echo "cpython.sh: building $src into $prefix (./configure $*)"
cd "$src"
./configure --prefix="$prefix" --with-ensurepip=install "$@" >configure.log 2>&1 \
	|| { tail -40 configure.log >&2; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { tail -60 make.log >&2; exit 1; }
make install >install.log 2>&1 || { tail -40 install.log >&2; exit 1; }
cd /
rm -rf "$work"
check || { echo "cpython.sh: the built $py lacks a module the suite needs" >&2; exit 1; }
echo "cpython.sh: $("$py" -VV | head -1) in $prefix"
