#!/usr/bin/env bash
# A Debian bookworm base image made here, for machines that cannot pull python:3.11-slim-bookworm from Docker Hub:
# debootstrap a minimal root filesystem from a Debian mirror and `docker import` it. Debian bookworm's python3 is
# 3.11, the version the lock is made for; python3-venv because Debian's own pip refuses system-wide installs, and
# the image installs into a venv on either base.
#   sudo bash deploy/smoke/base.sh [TAG]          # default tag cooper-base:bookworm
# DEBIAN_MIRROR overrides the mirror (default: the first bookworm URI apt uses on this machine, else deb.debian.org).
set -euo pipefail
tag=${1:-cooper-base:bookworm}
if [[ -z "${DEBIAN_MIRROR:-}" ]]; then
  DEBIAN_MIRROR=$(grep -hs -A2 -E '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list | grep -oE 'https?://[^ ]+/debian/?$' | head -n1 || true)
  DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
fi
root=$(mktemp -d /tmp/cooper-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# minbase: apt and dpkg but no init system or man pages; --include adds what the image needs beyond that.
debootstrap --variant=minbase --include=python3,python3-venv,tini,ca-certificates bookworm "$root" "$DEBIAN_MIRROR"
# The package cache and lists are build leftovers; the Dockerfile runs apt-get update itself when it needs to.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
tar -C "$root" --numeric-owner -c . | docker import - "$tag" >/dev/null
echo "$tag"
