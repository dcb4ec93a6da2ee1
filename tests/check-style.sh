#!/bin/sh
# Style checks run by `make check`: banned functions (STYLE.md) and
# clang-format conformance of lib/ and fcgi/, pyflakes3 on the test Python.
# Prints TAP.
set -u
cd "${top_srcdir:-.}"
n=0; failed=0
check() { n=$((n+1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed+1)); fi; }

banned=$(grep -nE '\b(strcpy|strcat|sprintf|vsprintf|gets|atoi|atol|strtok)[[:space:]]*\(' \
  lib/*.c lib/*.h fcgi/*.c fcgi/*.h tests/unit/*.c 2>/dev/null | grep -vE '\b(snprintf|vsnprintf)\(' || true)
[ -z "$banned" ]; check $? "no banned functions (strcpy strcat sprintf vsprintf gets atoi atol strtok)"
[ -n "$banned" ] && printf '%s\n' "$banned" | sed 's/^/# /'

if command -v clang-format >/dev/null 2>&1; then
  bad=""
  for f in lib/*.c lib/*.h fcgi/*.c fcgi/*.h; do
    case "$f" in lib/migrations.c) continue;; esac
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then bad="$bad $f"; fi
  done
  [ -z "$bad" ]; check $? "clang-format: sources are formatted"
  [ -n "$bad" ] && echo "# not formatted:$bad (run: clang-format -i <file>)"
else
  check 1 "clang-format is installed"
fi
# The Python that drives the tests and benchmarks: no unused imports, no
# undefined names (Debian's pyflakes3).
if command -v pyflakes3 >/dev/null 2>&1; then
  out=$(pyflakes3 tests/run.py tests/system/*.py tests/bench/*.py packaging/stack.py 2>&1)
  [ -z "$out" ]; check $? "pyflakes3: the test and packaging Python is clean"
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
else
  check 1 "pyflakes3 is installed"
fi
echo "1..$n"
[ "$failed" = 0 ]
