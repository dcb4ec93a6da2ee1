#!/bin/sh
# The library's interface to its programs (jansson's check-exports, over
# object files; TAP):
#   - lib/libcodexec.sym lists exactly the functions lib/codexec.h declares;
#   - codexec-fcgi, codexec-admin and codexec-kernel-launcher call nothing
#     of the library outside that list, and each function on it is called
#     by one of them (the interface is no wider than its users);
#   - each program's folder reaches lib/ through lib/codexec.h alone and
#     includes nothing of another program's folder; lib/codexec.h includes
#     no header of the project.
set -u
cd "${top_srcdir:-.}"
build=${abs_top_builddir:-.}
n=0; failed=0
check() { n=$((n+1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=$((failed+1)); fi; }

# Comments and macros dropped; cx_err is the error enum.
declared=$(perl -0777 -ne 's{/\*.*?\*/}{}gs; s{#define[^\n]*(?:\\\n[^\n]*)*}{}g;
  print "$1\n" while /\b(cx_[a-z0-9_]+)\s*\(/g' lib/codexec.h | sort -u | grep -v -x cx_err)
listed=$(sort -u lib/libcodexec.sym)
printf '%s\n' "$listed" >"$build/exports.wanted"
diff=$(printf '%s\n' "$declared" | diff - "$build/exports.wanted")
[ -z "$diff" ]; check $? "lib/libcodexec.sym is what lib/codexec.h declares"
[ -n "$diff" ] && printf '%s\n' "$diff" | sed 's/^/# /'

# What the library defines, and what each program's own objects leave
# undefined of it.
lib_a=$build/lib/.libs/libcodexec.a
if [ -f "$lib_a" ]; then
  nm --defined-only "$lib_a" | awk '$2 == "T" {print $3}' | sort -u >"$build/exports.lib"
  used=""
  for prog in "fcgi:fcgi/main.o fcgi/request.o fcgi/router.o fcgi/handlers.o fcgi/mcp.o" \
              "admin:admin/main.o" \
              "launcher:launcher/main.o launcher/sandbox.o launcher/relay.o launcher/keeper.o launcher/template.o"; do
    name=${prog%%:*}; objs=""
    for o in ${prog#*:}; do objs="$objs $build/$o"; done
    # shellcheck disable=SC2086
    nm -u $objs | awk '{print $2}' | sort -u >"$build/exports.u"
    # shellcheck disable=SC2086
    nm --defined-only $objs | awk '{print $3}' | sort -u >"$build/exports.d"
    calls=$(comm -23 "$build/exports.u" "$build/exports.d" | comm -12 - "$build/exports.lib")
    outside=$(printf '%s\n' "$calls" | grep . | grep -v -x -F -f "$build/exports.wanted" | tr '\n' ' ')
    [ -z "$outside" ]; check $? "$name calls only the interface's functions"
    [ -n "$outside" ] && echo "# not in lib/libcodexec.sym: $outside"
    used="$used $calls"
  done
  # cx_artifact_test_hooks is called only by a test-hooks build,
  # cx_log_level through the cx_log_debug macro.
  unused=$(printf '%s\n' $used | sort -u | comm -13 - "$build/exports.wanted" |
    grep -v -x -e cx_artifact_test_hooks -e cx_log_level | tr '\n' ' ')
  [ -z "$unused" ]; check $? "every function of the interface is called by a program"
  [ -n "$unused" ] && echo "# called by no program: $unused"
else
  check 1 "the library was built ($lib_a)"
fi

bad=$(for d in fcgi admin launcher; do
  for f in "$d"/*.c "$d"/*.h; do
    [ -f "$f" ] || continue
    grep -n '#include "\.\./' "$f" | grep -v '"\.\./lib/codexec.h"' | sed "s|^|$f:|"
  done
done)
[ -z "$bad" ]; check $? "each program includes lib/codexec.h alone of lib/, and nothing of the others"
[ -n "$bad" ] && printf '%s\n' "$bad" | sed 's/^/# /'

inc=$(grep -n '#include "' lib/codexec.h)
[ -z "$inc" ]; check $? "lib/codexec.h includes no header of the project"
[ -n "$inc" ] && printf '%s\n' "$inc" | sed 's/^/# /'
echo "1..$n"
[ "$failed" = 0 ]
