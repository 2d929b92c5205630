#!/bin/sh
# Installs the Debian packages llmsd needs to build and test. Idempotent: packages
# already present are not touched, and apt is not contacted when nothing is missing.
set -eu

PACKAGES="build-essential pkg-config clang libclang-rt-14-dev \
libopenblas-dev libpcre2-dev \
libevent-dev libsystemd-dev libprotobuf-c-dev protobuf-c-compiler libsqlite3-dev libzstd-dev \
libjson-c-dev curl python3 \
systemd"

missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
echo "install-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
