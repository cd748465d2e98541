#!/usr/bin/env bash
# Installs what is missing: Debian packages (when root with apt) and the Python virtualenv.
#   scripts/bootstrap.sh run    packages for `make run`
#   scripts/bootstrap.sh test   plus PostgreSQL and Chromium for `make test`
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"

packages=(redis-server openssh-server docker.io busybox-static iproute2)
if [ "$mode" = test ]; then packages+=(postgresql chromium fonts-dejavu-core); fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
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
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$python" -m venv .venv
fi
stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
  echo "==> installing Python packages"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev]"
  echo "$stamp" > .venv/.installed
fi
