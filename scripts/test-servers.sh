#!/usr/bin/env bash
# Real servers the test suite talks to, from Debian's packages, installed when missing:
#   openssh-server  tests/test_trigger_sftp.py checks SFTP triggers against a real sshd
#   chromium        tests/test_web.py drives the web page headless
# Needs root (or passwordless sudo); otherwise it says what is missing and the tests that
# need it skip with that reason (under CI=true they fail instead).
set -uo pipefail

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v chromium >/dev/null || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "note: ${missing[*]} not installed and no root: the tests needing them will skip" >&2
    exit 0
fi
echo "installing test servers: ${missing[*]}" >&2
$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    "${missing[@]}" >/dev/null
