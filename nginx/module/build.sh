#!/bin/bash
# Builds the codexec link module against nginx's source as Debian's
# nginx-dev ships it (/usr/share/nginx/src: the configure flags the
# running nginx was built with, so the module loads into it), the way
# Debian builds its own libnginx-mod-* packages (dh_nginx).
#   build.sh NGINX_SRC MODULE_DIR WORK_DIR OUTPUT.so
# Plain flags, not the build's: nginx itself has no sanitizer runtime;
# the outer make's options (MAKEFLAGS) are not passed on to nginx's make.
# The module and the objects are named by relative paths: nginx's
# auto/make turns a ".S" or ".c" anywhere in an object's path into ".o"
# (its sed loses the "$" anchor), and a checkout under /tmp/tmp.Sxxxx (a
# mktemp -d) failed to build.
set -euo pipefail
src=$1 mod=$2 work=$3 out=$4
rm -rf "$work"
mkdir -p "$work"
cp -R "$src" "$work/src"
cp -R "$mod" "$work/module"
cd "$work/src"
# shellcheck disable=SC1091
. ./conf_flags
cflags="-g -O2 -fstack-protector-strong -Wformat -Werror=format-security -D_FORTIFY_SOURCE=2 -fPIC"
if ! CC=cc ./configure --with-cc-opt="$cflags" --with-ld-opt="-Wl,-z,relro -Wl,-z,now -fPIC" \
    "${NGX_CONF_FLAGS[@]}" --add-dynamic-module=../module --builddir=../objs \
    >"$work/configure.log" 2>&1; then
  tail -20 "$work/configure.log" >&2
  echo "nginx/module/build.sh: nginx's configure failed (see $work/configure.log)" >&2
  exit 1
fi
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -f "$work/objs/Makefile" modules >"$work/make.log" 2>&1 || { cat "$work/make.log" >&2; exit 1; }
cp "$work/objs/ngx_http_codexec_link_module.so" "$out.tmp"
mv "$out.tmp" "$out"
