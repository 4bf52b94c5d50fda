#!/usr/bin/env bash
# Screenshots of a `--stacks` trace's flame graphs in the Perfetto UI (docs/export.md,
# "Python stacks as flame graphs"):
#
#   tracer/tests/perfetto/stack_screenshots.sh TRACE.jsonl OUT_DIR
#
# Exports TRACE to Perfetto protobuf into OUT_DIR and has headless Chromium take
# OUT_DIR/NAME-pftrace-{calls,gpu-time}.png (stack_screenshots.mjs), set up as
# screenshots.sh sets up (the pinned UI, playwright-core, Chromium; CHROMIUM=PATH,
# CUDATRACE=PATH).
set -euo pipefail
if (($# != 2)); then
    sed -n '2,11p' "$0" >&2
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
[[ -n $cudatrace ]] || { echo "stack_screenshots: build cudatrace first (cargo build)" >&2; exit 2; }
chromium=${CHROMIUM:-$(command -v chromium || true)}
[[ -n $chromium ]] || { echo "stack_screenshots: no chromium: apt-get install chromium (or set CHROMIUM)" >&2; exit 2; }

ui=$(python3 "$here/fetch_ui.py" "$repo/target/tmp/perfetto-ui")
playwright=$repo/target/perfetto-screenshots
if [[ ! -d $playwright/node_modules/playwright-core ]]; then
    npm install --prefix "$playwright" --no-audit --no-fund --ignore-scripts playwright-core@1.65.1 >&2
fi

mkdir -p "$out"
name=$(basename "$trace" .jsonl)
"$cudatrace" export "$trace" --format perfetto -o "$out/$name.pftrace"
node "$here/stack_screenshots.mjs" --ui "$ui" --playwright "$playwright" --chromium "$chromium" \
    --out "$out" "$out/$name.pftrace"
