#!/usr/bin/env bash
# The browser test drives the system's Chromium (README, "The browser test"). Run first by
# `make test`, so a machine without a browser learns it in seconds, not after the suite:
#   - DISTCOURSE_CHROMIUM set, or chromium on the PATH: nothing to do;
#   - root with apt-get (Debian/Ubuntu): install the `chromium` package;
#   - otherwise: stop with the one-line instruction (exit 1).
set -euo pipefail

if [ -n "${DISTCOURSE_CHROMIUM:-}" ]; then
    if [ -x "$DISTCOURSE_CHROMIUM" ]; then exit 0; fi
    echo "DISTCOURSE_CHROMIUM=$DISTCOURSE_CHROMIUM is not an executable file" >&2
    exit 1
fi
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "chromium is missing: installing Debian's package (apt-get, as root) ..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    command -v chromium >/dev/null && exit 0
    echo "apt-get installed no chromium command" >&2
    exit 1
fi
echo "make test needs Chromium for its browser test: as root run" \
     "'apt-get install chromium', or set DISTCOURSE_CHROMIUM=/path/to/chromium" >&2
exit 1
