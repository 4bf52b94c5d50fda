#!/usr/bin/env python3
"""Runs SQL on Parquet files with DuckDB's own Python package, pinned, for the export tests.

    python3 duckdb_query.py CACHE_DIR < queries.json

reads {"queries": ["SELECT ...", ...]} on stdin and prints {"results": [[row, ...], ...]}:
each query's rows as JSON arrays (integers stay exact; lists are arrays).

DuckDB comes from PyPI's duckdb 1.5.6 wheel for the running Python (CPython 3.11, 3.12 or
3.13 on x86-64 Linux): downloaded once with pip, checked against the sha256 pinned below,
and unpacked into CACHE_DIR/duckdb-1.5.6-cpXY/ (a wheel is a zip; nothing is installed into
the system). The cache is reused while its wheel has its hash. Offline: download the wheel
elsewhere (the file named for your Python in WHEELS) and set CUDATRACE_DUCKDB_WHEEL=/path;
it is checked like a download.

Exit codes: 0 answered; 1 a hash differs or a query failed; 2 usage or no pinned wheel for
this Python; 3 the download failed.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

VERSION = "1.5.6"
PLATFORM = "manylinux_2_26_x86_64.manylinux_2_28_x86_64"
# sha256 of each wheel, by CPython version.
WHEELS = {
    "311": "73b108c04c932b36c2fa4e41110cc1c3c8cd510eb49f065f92d050be8e6929fd",
    "312": "bc9619ed7d4ffa117b5155d84b44794366bb6635178d78ed5e13a6024845c757",
    "313": "644f54ce99b3b61844bc9a3fe80e0aecb1ea4084b1fffc4396d1569db6111679",
}


def say(message):
    print(f"duckdb_query: {message}", file=sys.stderr)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_name(tag):
    return f"duckdb-{VERSION}-cp{tag}-cp{tag}-{PLATFORM}.whl"


def check(path, tag):
    got = sha256(path)
    if got != WHEELS[tag]:
        say(f"{path}: sha256 {got}, but the pinned {wheel_name(tag)} has {WHEELS[tag]}")
        sys.exit(1)


def download(directory, tag):
    """pip download of the pinned wheel for this Python into `directory`; one retry."""
    command = [
        sys.executable, "-m", "pip", "download", f"duckdb=={VERSION}", "--no-deps",
        "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
        "--retries", "0", "--timeout", "60", "-d", directory,
    ]
    path = os.path.join(directory, wheel_name(tag))
    for attempt in (1, 2):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0 and os.path.isfile(path):
            return path
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-4:])
        if "No module named pip" in tail:
            say("pip is missing: install it (Debian: apt-get install python3-pip)")
            sys.exit(3)
        say(f"attempt {attempt}: pip download duckdb=={VERSION} failed:\n{tail}")
    say(
        f"could not download duckdb {VERSION} from PyPI. Fetch {wheel_name(tag)} "
        f"(sha256 {WHEELS[tag]}) elsewhere and set CUDATRACE_DUCKDB_WHEEL=/path/to/it"
    )
    sys.exit(3)


def ready(cache):
    """The unpacked package's folder for this Python, fetched and unpacked if needed."""
    tag = f"{sys.version_info.major}{sys.version_info.minor}"
    if tag not in WHEELS:
        say(
            f"no pinned duckdb wheel for Python {sys.version_info.major}."
            f"{sys.version_info.minor} (pinned: CPython 3.11, 3.12, 3.13)"
        )
        sys.exit(2)
    root = os.path.join(os.path.abspath(cache), f"duckdb-{VERSION}-cp{tag}")
    unpacked = os.path.join(root, "site")
    os.makedirs(root, exist_ok=True)
    # Tests run this in parallel: one fetches and unpacks while the others wait on the lock,
    # so none imports from a folder another is replacing or reads a half-written wheel.
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return unpack(root, unpacked, tag)


def unpack(root, unpacked, tag):
    """Under the cache's lock: the unpacked folder, made from the checked wheel if needed."""
    stamp = os.path.join(unpacked, ".sha256")
    if os.path.isfile(stamp) and open(stamp).read() == WHEELS[tag]:
        return unpacked
    wheel = os.environ.get("CUDATRACE_DUCKDB_WHEEL")
    if not wheel:
        wheel = os.path.join(root, wheel_name(tag))
        if os.path.isfile(wheel) and sha256(wheel) != WHEELS[tag]:
            os.remove(wheel)
        if not os.path.isfile(wheel):
            say(f"downloading duckdb {VERSION} for CPython {tag} from PyPI")
            wheel = download(root, tag)
    check(wheel, tag)
    staging = tempfile.mkdtemp(prefix=".site-", dir=root)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(staging)
    with open(os.path.join(staging, ".sha256"), "w") as f:
        f.write(WHEELS[tag])
    shutil.rmtree(unpacked, ignore_errors=True)
    os.rename(staging, unpacked)
    return unpacked


def plain(value):
    """A DuckDB value as JSON: exact integers, lists as arrays."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    # HUGEINT sums come back as int; decimals and others as their text.
    return str(value)


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, ready(sys.argv[1]))
    import duckdb  # noqa: E402 (the pinned copy, just put on the path)

    queries = json.load(sys.stdin)["queries"]
    connection = duckdb.connect()
    results = []
    for query in queries:
        try:
            rows = connection.execute(query).fetchall()
        except duckdb.Error as e:
            say(f"query failed: {e}\n{query}")
            sys.exit(1)
        results.append([[plain(v) for v in row] for row in rows])
    json.dump({"results": results, "duckdb": duckdb.__version__}, sys.stdout)


if __name__ == "__main__":
    main()
