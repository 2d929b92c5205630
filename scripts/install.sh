#!/bin/sh
# install.sh DESTDIR PREFIX BUILD [VERSION] — what `make install` does: copies the programs,
# libllmsclient, its header and pkg-config file, the systemd units and snippets, and the
# example configuration (never over an existing one) into DESTDIR/PREFIX.
set -eu
if [ $# -ne 3 ] && [ $# -ne 4 ]; then
    echo "usage: install.sh DESTDIR PREFIX BUILD [VERSION]" >&2
    exit 2
fi
destdir=$1 prefix=$2 build=$3
src=$(cd "$(dirname "$0")/.." && pwd)
# The Makefile defines the version once; run by hand, this reads it from there.
version=${4:-$(sed -n 's/^VERSION *:= *//p' "$src/Makefile")}
root=$destdir$prefix

for f in llmsd llms llmsctl llms-run mkmodel libllmsclient.so libllmsclient.a; do
    if [ ! -f "$build/$f" ]; then
        echo "install.sh: $build/$f is missing (run make first)" >&2
        exit 1
    fi
done

install -d "$root/sbin" "$root/bin" "$root/lib/pkgconfig" "$root/include" \
    "$root/lib/systemd/system" "$root/lib/sysusers.d" "$root/lib/tmpfiles.d" \
    "$destdir/etc/llmsd"

install -m 0755 "$build/llmsd" "$root/sbin/llmsd"
for p in llms llmsctl llms-run mkmodel; do
    install -m 0755 "$build/$p" "$root/bin/$p"
done

# The shared library goes under its soname with the development link beside it.
install -m 0755 "$build/libllmsclient.so" "$root/lib/libllmsclient.so.6"
ln -sf libllmsclient.so.6 "$root/lib/libllmsclient.so"
# Installed into the running system (no DESTDIR), the dynamic loader finds the library
# outside /lib and /usr/lib (PREFIX /usr/local) only through its cache: an app linked
# with -lllmsclient would not start until something ran ldconfig. Into a DESTDIR, the
# package's own installation runs it.
if [ -z "$destdir" ]; then
    ldconfig
fi

# The build's libllmsclient.a carries the protocol code too, llms.h's API its only
# globals (the Makefile says how), so it is installed as it is.
install -m 0644 "$build/libllmsclient.a" "$root/lib/libllmsclient.a"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

install -m 0644 "$src/client/llms.h" "$root/include/llms.h"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$src/client/llmsclient.pc.in" \
    >"$tmp/llmsclient.pc"
install -m 0644 "$tmp/llmsclient.pc" "$root/lib/pkgconfig/llmsclient.pc"

# Only the ExecStart line holds the placeholder; the header comment stays as written.
sed -e "/^ExecStart=/s|@SBINDIR@|$prefix/sbin|" "$src/systemd/llmsd.service" >"$tmp/llmsd.service"
install -m 0644 "$tmp/llmsd.service" "$root/lib/systemd/system/llmsd.service"
install -m 0644 "$src/systemd/llmsd.socket" "$root/lib/systemd/system/llmsd.socket"
install -m 0644 "$src/systemd/llmsd.sysusers" "$root/lib/sysusers.d/llmsd.conf"
install -m 0644 "$src/systemd/llmsd.tmpfiles" "$root/lib/tmpfiles.d/llmsd.conf"
# A drop-in to copy by hand: the shipped unit stays on Unix sockets (systemd/README.md).
install -d "$root/share/llmsd"
install -m 0644 "$src/systemd/http-tcp.conf" "$root/share/llmsd/http-tcp.conf"
install -m 0644 "$src/systemd/cuda.conf" "$root/share/llmsd/cuda.conf"

if [ -e "$destdir/etc/llmsd/llmsd.conf" ]; then
    echo "install.sh: keeping the existing $destdir/etc/llmsd/llmsd.conf"
else
    install -m 0644 "$src/systemd/llmsd.conf" "$destdir/etc/llmsd/llmsd.conf"
fi
echo "installed under $root"
