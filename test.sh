#!/usr/bin/env bash
# Run the whole test suite as root: installs what is missing first (./install.sh is idempotent).
# Tests that build labs use their own state directory and lab names starting with "lt".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/install.sh"
cd "$here"
exec "$here/.venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
