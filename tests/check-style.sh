#!/bin/sh
# Style checks run by `make check`: banned functions (STYLE.md) and
# clang-format conformance of lib/ and fcgi/, pyflakes3 on the test Python.
# Prints TAP.
set -u
cd "${top_srcdir:-.}"
n=0; failed=0
check() { n=$((n+1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed+1)); fi; }

banned=$(grep -nE '\b(strcpy|strcat|sprintf|vsprintf|gets|atoi|atol|strtok)[[:space:]]*\(' \
  lib/*.c lib/*.h fcgi/*.c fcgi/*.h admin/*.c launcher/*.c launcher/*.h tests/unit/*.c 2>/dev/null | grep -vE '\b(snprintf|vsnprintf)\(' || true)
[ -z "$banned" ]; check $? "no banned functions (strcpy strcat sprintf vsprintf gets atoi atol strtok)"
[ -n "$banned" ] && printf '%s\n' "$banned" | sed 's/^/# /'

if command -v clang-format >/dev/null 2>&1; then
  bad=""
  for f in lib/*.c lib/*.h fcgi/*.c fcgi/*.h admin/*.c launcher/*.c launcher/*.h; do
    case "$f" in lib/migrations.c) continue;; esac
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then bad="$bad $f"; fi
  done
  [ -z "$bad" ]; check $? "clang-format: sources are formatted"
  [ -n "$bad" ] && echo "# not formatted:$bad (run: clang-format -i <file>)"
else
  check 1 "clang-format is installed"
fi
# No function in lib/, fcgi/, admin/ or launcher/ longer than 60 lines (curl's
# top-complexity, by length): short named steps. No exceptions.
long=$(awk -v max=60 -f tools/funclen.awk lib/*.c fcgi/*.c admin/*.c launcher/*.c 2>/dev/null | grep -v '^lib/migrations.c\|^lib/capture-helper.c')
[ -z "$long" ]; check $? "no function longer than 60 lines"
[ -n "$long" ] && printf '%s\n' "$long" | sed 's/^/# /'

# The headers' layers (docs/internals/map.md): a header includes only
# headers of a lower layer, so there can be no cycle.
layer() {
  case "$1" in
    codexec.h) echo 0 ;;
    buf.h|digest.h) echo 1 ;;
    util.h|log.h|conf.h|config.h|mime.h|storage.h|s3.h|http.h|metrics.h|health.h|runend.h|cancel.h) echo 2 ;;
    db.h|ws.h|gateway.h) echo 3 ;;
    auth.h|kernel.h|run.h|capture.h) echo 4 ;;
    authdb.h|session.h|sessdb.h|budget.h|prestart.h|artifact.h|download.h|page.h|stage.h|runexec.h|watch.h|lane.h|dlcache.h|files.h|journal.h) echo 5 ;;
    mcp.h) echo 6 ;;
    *) echo unknown ;;
  esac
}
cycles=""
for h in lib/*.h; do
  name=${h#lib/}; mine=$(layer "$name")
  if [ "$mine" = unknown ]; then cycles="$cycles $name(not in a layer)"; continue; fi
  for inc in $(grep -o '#include "[a-z_]*\.h"' "$h" | sed 's/#include "//; s/"//'); do
    theirs=$(layer "$inc")
    if [ "$theirs" = unknown ] || [ "$theirs" -ge "$mine" ]; then cycles="$cycles $name->$inc"; fi
  done
done
[ -z "$cycles" ]; check $? "headers include only lower layers"
[ -n "$cycles" ] && echo "# against the layers:$cycles"

# No circle among the modules: lib/X.c including Y.h (a module of its own,
# with its Y.c) is an arrow X -> Y; tsort finds any loop over them.
arrows=$(for f in lib/*.c; do
  m=${f#lib/}; m=${m%.c}
  for h in $(grep -o '#include "[a-z_]*\.h"' "$f" | sed 's/#include "//; s/\.h"//'); do
    [ "$h" != "$m" ] && [ -f "lib/$h.c" ] && echo "$m $h"
  done
done)
loops=$(printf '%s\n' "$arrows" | tsort 2>&1 >/dev/null | grep -v 'input contains a loop' | sed 's/^tsort: //' | tr '\n' ' ')
[ -z "$loops" ]; check $? "no circle among lib/'s modules (tsort over their includes)"
[ -n "$loops" ] && echo "# in a loop: $loops"

# The Python that drives the tests and benchmarks: no unused imports, no
# undefined names (Debian's pyflakes3).
if command -v pyflakes3 >/dev/null 2>&1; then
  out=$(pyflakes3 tests/run.py tests/system/*.py tests/bench/*.py packaging/stack.py \
    tests/clients/*.py clients/python/codexec/*.py clients/python/build_backend.py \
    integrations/*/*.py launcher/front.py 2>&1)
  [ -z "$out" ]; check $? "pyflakes3: the test and packaging Python is clean"
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
else
  check 1 "pyflakes3 is installed"
fi
echo "1..$n"
[ "$failed" = 0 ]
