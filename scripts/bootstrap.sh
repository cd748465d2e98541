#!/usr/bin/env bash
# Installs what is missing: Debian packages (when root with apt) and the Python virtualenv.
#   scripts/bootstrap.sh run    packages for `make run`
#   scripts/bootstrap.sh test   plus PostgreSQL and Chromium for `make test`
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"

# python3-venv: Debian's python3 cannot make a virtualenv without it (no ensurepip).
# libpango and a font: WeasyPrint lays out the PDF invoices. caddy: the cluster gateway.
# btrfs-progs and e2fsprogs: the simulated hosts' enforced-disk Docker Engine (btrfs data
# root) and the volumes' filesystem images. iptables: the hosts' tenant firewall (set up at
# each probe; docker.io pulls it in too, named here as the platform runs it itself). rsync:
# `vastai copy` runs it on the renter's side, and the simulated hosts' SSH image carries it.
packages=(python3 python3-venv redis-server openssh-server docker.io busybox-static iproute2
  procps libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core caddy btrfs-progs e2fsprogs
  iptables rsync)
# systemd: the production recipe's test (deploy/) runs systemd-analyze verify.
if [ "$mode" = test ]; then packages+=(postgresql chromium systemd); fi

missing=()
if command -v dpkg-query >/dev/null; then
  for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "!! missing Debian packages: ${missing[*]}"
    echo "!! install them with: sudo apt-get install ${missing[*]}"
    [ "$mode" = test ] && exit 1
  fi
fi

python=${PYTHON:-python3}
if ! command -v "$python" >/dev/null; then
  echo "!! $python is not installed: apt-get install python3 python3-venv"
  exit 1
fi

# A usable .venv runs its python and its pip. One left half-made (an interrupted first run, a
# venv made before python3-venv was installed, a Python upgraded underneath it) is made again.
venv_works() {
  [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1
}
if ! venv_works; then
  if [ -e .venv ]; then
    echo "==> .venv is incomplete or broken; making it again"
    rm -rf .venv
  fi
  echo "==> creating .venv"
  if ! "$python" -m venv .venv; then
    rm -rf .venv
    echo "!! could not create .venv with $python; install python3-venv (apt-get install python3-venv)"
    exit 1
  fi
fi
stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
  echo "==> installing Python packages"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$stamp" > .venv/.installed  # written last: an interrupted install runs again next time
fi
