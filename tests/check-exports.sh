#!/bin/sh
# The public library's surface (jansson's check-exports, in TAP):
#   - libcodexec.so exports exactly the functions in lib/libcodexec.sym;
#   - each of them is declared in a public header (lib/codexec.h's set);
#   - fcgi/ reaches lib/ only through lib/codexec.h (the kernel launcher,
#     which is the sandbox's and not a host of the library, excepted).
set -u
cd "${top_srcdir:-.}"
build=${abs_top_builddir:-.}
n=0; failed=0
check() { n=$((n+1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed+1)); fi; }

so=$build/lib/.libs/libcodexec.so
if [ -f "$so" ]; then
  nm -D --defined-only "$so" | awk '$2 ~ /^[TW]$/ {print $3}' | sort >"$build/exports.actual"
  sort lib/libcodexec.sym >"$build/exports.wanted"
  diff "$build/exports.wanted" "$build/exports.actual" >"$build/exports.diff"
  check $? "libcodexec.so exports exactly lib/libcodexec.sym"
  sed 's/^/# /' "$build/exports.diff"
else
  check 1 "libcodexec.so was built ($so)"
fi

public=$(grep -o '#include "[a-z]*\.h"' lib/codexec.h | sed 's/#include "//; s/"//' | sed 's|^|lib/|')
missing=""
for sym in $(cat lib/libcodexec.sym); do
  # shellcheck disable=SC2086
  grep -q "\b$sym(" $public || missing="$missing $sym"
done
[ -z "$missing" ]; check $? "every exported function is declared in a public header"
[ -n "$missing" ] && echo "# not declared:$missing"

bad=$(grep -l '#include "\.\./lib/' fcgi/*.c fcgi/*.h | while read -r f; do
  [ "$f" = fcgi/launcher.c ] && continue
  grep '#include "\.\./lib/' "$f" | grep -v '"\.\./lib/codexec.h"' | sed "s|^|$f: |"
done)
[ -z "$bad" ]; check $? "fcgi/ includes lib/ only through lib/codexec.h"
[ -n "$bad" ] && printf '%s\n' "$bad" | sed 's/^/# /'
echo "1..$n"
[ "$failed" = 0 ]
