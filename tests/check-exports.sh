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

# And the converse: every function a public header declares is exported
# (else a host linking the library, like tests/public, fails to link).
# Comments and macros are dropped first; cx_err is the error enum and
# cx_artifact_test_hooks a test-only structure.
# shellcheck disable=SC2086
declared=$(perl -0777 -ne 's{/\*.*?\*/}{}gs; s{#define[^\n]*(?:\\\n[^\n]*)*}{}g;
  print "$1\n" while /\b(cx_[a-z0-9_]+)\s*\(/g' $public | sort -u |
  grep -v -x -e cx_err -e cx_artifact_test_hooks)
unexported=""
for sym in $declared; do
  grep -q -x "$sym" lib/libcodexec.sym || unexported="$unexported $sym"
done
[ -z "$unexported" ]; check $? "every function a public header declares is in lib/libcodexec.sym"
[ -n "$unexported" ] && echo "# not exported:$unexported"

bad=$(grep -l '#include "\.\./lib/' fcgi/*.c fcgi/*.h | while read -r f; do
  [ "$f" = fcgi/launcher.c ] && continue
  grep '#include "\.\./lib/' "$f" | grep -v '"\.\./lib/codexec.h"' | sed "s|^|$f: |"
done)
[ -z "$bad" ]; check $? "fcgi/ includes lib/ only through lib/codexec.h"
[ -n "$bad" ] && printf '%s\n' "$bad" | sed 's/^/# /'
# The installed headers compile on their own: every header lib/codexec.h
# reaches, through any number of includes, is installed (pkginclude_HEADERS).
installed=$(sed -n '/^pkginclude_HEADERS/,/[^\\]$/p' Makefile.am | tr -s ' \t\\' '\n' | grep '^lib/')
reached=""; todo="lib/codexec.h"
while [ -n "$todo" ]; do
  set -- $todo; h=$1; shift; todo="$*"
  case " $reached " in *" $h "*) continue ;; esac
  reached="$reached $h"
  for inc in $(grep -o '#include "[a-z_]*\.h"' "$h" | sed 's/#include "//; s/"//'); do
    todo="$todo lib/$inc"
  done
done
missing=""
for h in $reached; do
  printf '%s\n' "$installed" | grep -q -x "$h" || missing="$missing $h"
done
[ -z "$missing" ]; check $? "every header lib/codexec.h reaches is installed"
[ -n "$missing" ] && echo "# not in pkginclude_HEADERS:$missing"
echo "1..$n"
[ "$failed" = 0 ]
