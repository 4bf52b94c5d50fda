"""The file offset of an exported function in a shared library, as tracefs's `p:` and `r:`
uprobe events take it: its address less its LOAD segment's address plus the segment's file
offset. Prints it in hex; exits 1 if the library does not export the symbol.

usage: python3 file_offset.py LIBRARY SYMBOL
"""

import subprocess
import sys


def main() -> int:
    lib, symbol = sys.argv[1:3]
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", lib], capture_output=True, text=True).stdout
    addrs = [int(f[1], 16) for f in (line.split() for line in syms.splitlines())
             if len(f) >= 8 and f[7] == symbol]
    if not addrs:
        print(f"file_offset: {lib} exports no {symbol}", file=sys.stderr)
        return 1
    addr = addrs[0]
    for line in subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True).stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and int(f[2], 16) <= addr < int(f[2], 16) + int(f[4], 16):
            print(hex(addr - int(f[2], 16) + int(f[1], 16)))
            return 0
    print(f"file_offset: {symbol} at {addr:#x} is in no LOAD segment of {lib}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
