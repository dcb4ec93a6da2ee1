#!/bin/sh
# Regenerates the build system (configure, Makefile.in) from a clone.
set -eu
cd "$(dirname "$0")"
mkdir -p build-aux m4
autoreconf -fi
# The TAP driver ships with automake; copy it for `make check`.
for d in /usr/share/automake-*; do
  if [ -f "$d/tap-driver.sh" ]; then cp "$d/tap-driver.sh" build-aux/; break; fi
done
test -f build-aux/tap-driver.sh
