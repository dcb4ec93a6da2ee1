#!/bin/sh
# Style checks run by `make check`: banned functions (STYLE.md) and
# clang-format conformance of lib/ and fcgi/. Prints TAP.
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
echo "1..$n"
[ "$failed" = 0 ]
