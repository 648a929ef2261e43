#!/usr/bin/env python3
"""What one fdatasync costs, by what the write before it does to the file.

Runs PROCS processes at once, each writing SIZE bytes and calling fdatasync in a loop for
SECONDS, in one of three ways:

- append:   every write extends the file (its size changes before every sync);
- zeroed:   the file was zero-filled (and synced) first; writes overwrite the zeros;
- falloc:   the file was posix_fallocate'd first (unwritten extents); writes land in them.

With --direct the writes use O_DIRECT from page-aligned buffers. Prints syncs per second
per process and in all. Standard library only; files go under DIR and are removed.

    python3 bench/sync_cost.py --dir target/sync-cost --procs 3 --sizes 8192,49152
"""

import argparse
import mmap
import multiprocessing
import os
import time

REGION = 256 << 20  # zeroed / fallocated region, reused in a ring


def run(mode, size, seconds, path, direct, out):
    buf = mmap.mmap(-1, size)
    buf.write(os.urandom(size))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if mode == "zeroed":
        zero = bytes(1 << 20)
        for _ in range(REGION >> 20):
            os.write(fd, zero)
        os.fsync(fd)
    elif mode == "falloc":
        # Large enough that the loop never leaves fresh (unwritten) space.
        os.posix_fallocate(fd, 0, 2 << 30)
        os.fsync(fd)
    if direct:
        os.close(fd)
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    off = n = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        os.pwrite(fd, buf, off)
        os.fdatasync(fd)
        off += size
        n += 1
        if mode == "zeroed" and off + size > REGION:
            off = 0
    out.put(n / (time.monotonic() - t0))
    os.close(fd)
    os.unlink(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="target/sync-cost")
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--sizes", default="8192,49152")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--modes", default="append,zeroed,falloc")
    p.add_argument("--direct", action="store_true")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    for size in [int(s) for s in a.sizes.split(",")]:
        for mode in a.modes.split(","):
            q = multiprocessing.Queue()
            ps = [
                multiprocessing.Process(
                    target=run,
                    args=(mode, size, a.seconds, os.path.join(a.dir, f"f{i}"), a.direct, q),
                )
                for i in range(a.procs)
            ]
            for x in ps:
                x.start()
            rates = [q.get() for _ in ps]
            for x in ps:
                x.join()
            print(
                f"{'direct' if a.direct else 'buffered'} {mode:7s} {size:6d} B: "
                f"{sum(rates):8.0f} syncs/s in all, per process "
                + " ".join(f"{r:.0f}" for r in rates)
            )


if __name__ == "__main__":
    main()
