#!/bin/sh
# The README's two commands, for a bare Debian machine that may lack make:
#   sh make.sh run     set up, then launch sockherd
#   sh make.sh test    set up, then run the whole suite (what CI runs)
# Installs make from Debian if it is missing (as root), then hands over to
# the Makefile, which installs everything else it needs.
set -eu
cd "$(dirname "$0")"
if ! command -v make >/dev/null 2>&1; then
	echo "make.sh: installing make (Debian package)" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq make
fi
exec make "$@"
