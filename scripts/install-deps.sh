#!/bin/sh
# Installs the Debian packages llmsd needs to build and test. Idempotent: packages
# already present are not touched, and apt is not contacted when nothing is missing.
#
#   scripts/install-deps.sh                          install what is missing
#   scripts/install-deps.sh --purge-build-packages   remove the libraries' -dev packages
#       and protoc-c instead, so that the next `make check` starts as on a fresh machine
#       (.ci/run does this under CI=true: a broken install step then fails CI)
set -eu

# What the build reads through pkg-config and protoc-c: exactly these are purged.
BUILD_PACKAGES="libopenblas-dev libpcre2-dev libevent-dev libsystemd-dev libprotobuf-c-dev \
protobuf-c-compiler libsqlite3-dev libzstd-dev libjson-c-dev libsodium-dev"

PACKAGES="build-essential pkg-config clang libclang-rt-14-dev $BUILD_PACKAGES \
curl python3 systemd"

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive

if [ "${1:-}" = --purge-build-packages ]; then
    echo "install-deps: purging the build packages:" $BUILD_PACKAGES
    # shellcheck disable=SC2086
    $SUDO apt-get purge -y -qq $BUILD_PACKAGES >/dev/null
    exit 0
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--purge-build-packages]" >&2
    exit 2
fi

missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
