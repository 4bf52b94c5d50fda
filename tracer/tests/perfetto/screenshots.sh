#!/usr/bin/env bash
# Screenshots of a cudatrace trace in the Perfetto UI (what docs/export.md describes):
#
#   tracer/tests/perfetto/screenshots.sh TRACE.jsonl OUT_DIR
#
# Exports TRACE in both formats into OUT_DIR, fetches the pinned Perfetto UI (fetch_ui.py,
# cached in target/tmp/perfetto-ui), installs playwright-core into target/perfetto-screenshots
# if it is not there, serves the UI from 127.0.0.1 and has headless Chromium take
# OUT_DIR/NAME-{json,pftrace}-{timeline,launch,sync}.png (screenshots.mjs). Needs Node.js 18+
# and Chromium (Debian: apt-get install chromium); CHROMIUM=PATH picks another binary,
# CUDATRACE=PATH another cudatrace.
set -euo pipefail
if (($# != 2)); then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
trace=$1
out=$2
cudatrace=${CUDATRACE:-}
if [[ -z $cudatrace ]]; then
    for build in release debug; do
        [[ -x $repo/target/$build/cudatrace ]] && cudatrace=$repo/target/$build/cudatrace && break
    done
fi
[[ -n $cudatrace ]] || { echo "screenshots: build cudatrace first (cargo build)" >&2; exit 2; }
chromium=${CHROMIUM:-$(command -v chromium || true)}
[[ -n $chromium ]] || { echo "screenshots: no chromium: apt-get install chromium (or set CHROMIUM)" >&2; exit 2; }

ui=$(python3 "$here/fetch_ui.py" "$repo/target/tmp/perfetto-ui")
playwright=$repo/target/perfetto-screenshots
if [[ ! -d $playwright/node_modules/playwright-core ]]; then
    npm install --prefix "$playwright" --no-audit --no-fund --ignore-scripts playwright-core@1.65.1 >&2
fi

mkdir -p "$out"
name=$(basename "$trace" .jsonl)
"$cudatrace" export "$trace" -o "$out/$name.json"
"$cudatrace" export "$trace" --format perfetto -o "$out/$name.pftrace"
node "$here/screenshots.mjs" --ui "$ui" --playwright "$playwright" --chromium "$chromium" \
    --out "$out" "$out/$name.json" "$out/$name.pftrace"
