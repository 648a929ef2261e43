#!/usr/bin/env python3
"""What the size of the writes that zero-fill ahead of a buffered log does to later appends.

For each PIECE size: a fresh file gets ZEROS bytes of zeros written in writes of PIECE
bytes, synced (PIECE 0: no zeros, the file grows with every append); then COUNT appends of SIZE bytes, each followed by
fdatasync, fill the zeros from offset 0. Prints, per piece size, the process's
`write_bytes` (/proc/self/io) and the device's sectors written (/sys/block/DEV/stat)
during the appends, each per byte appended, and the syncs per second.

The page cache may size a folio by the write that creates it; a later small write into a
clean folio then dirties, and counts, all of it. Standard library only; the file goes
under DIR and is removed. DEV is the block device holding DIR (`lsblk`); other writers on
it show up in its figure.

    python3 bench/zero_pieces.py --dir target/zero-pieces --dev vda
"""

import argparse
import os
import time


def write_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes"):
                return int(line.split()[1])
    raise RuntimeError("no write_bytes in /proc/self/io")


def sectors(dev):
    with open(f"/sys/block/{dev}/stat") as f:
        return int(f.read().split()[6])


def run(path, dev, piece, zeros, count, size):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if piece:
            z = bytes(piece)
            for off in range(0, zeros, piece):
                os.pwrite(fd, z[: min(piece, zeros - off)], off)
            os.fdatasync(fd)
        data = os.urandom(size)
        wb0, s0, t0 = write_bytes(), sectors(dev), time.monotonic()
        off = 0
        for _ in range(count):
            os.pwrite(fd, data, off)
            off += size
            os.fdatasync(fd)
        dt = time.monotonic() - t0
        appended = count * size
        return (
            (write_bytes() - wb0) / appended,
            (sectors(dev) - s0) * 512 / appended,
            count / dt,
        )
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="target/zero-pieces")
    ap.add_argument("--dev", required=True, help="block device name, e.g. vda")
    ap.add_argument("--pieces", default="0,4096,16384,65536,1048576")
    ap.add_argument("--zeros", type=int, default=8 << 20)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--size", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    if a.count * a.size > a.zeros:
        ap.error("--count × --size must fit in --zeros (the appends fill the zeros)")
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "f")
    print(f"{a.count} appends of {a.size} B, each synced, into {a.zeros} B of zeros")
    print("piece_bytes  write_bytes/appended  device/appended  syncs/s")
    for r in range(a.repeats):
        for p in [int(x) for x in a.pieces.split(",")]:
            wb, dv, sps = run(path, a.dev, p, a.zeros, a.count, a.size)
            label = "none" if p == 0 else str(p)
            print(f"{label:>11}  {wb:20.2f}  {dv:15.2f}  {sps:7.0f}")


if __name__ == "__main__":
    main()
