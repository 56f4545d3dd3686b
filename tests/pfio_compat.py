#!/usr/bin/env python3
"""A format-level stand-in for pfio's cache files (stdlib only), used by cache_format_test.

This is NOT pfio. pfio cannot be installed on the build machines, so this script reads and
writes the cache file exactly as pfio's MultiprocessFileCache / ReadOnlyFileCache do with
do_pickle=False (pfio/cache/multiprocess_file_cache.py, file_cache.py, mmap_file_cache.py):

  * the file starts with `length` index entries of struct.pack('Qq', offset, length);
  * an empty slot is written explicitly as (0, -1);
  * put appends the raw bytes at the end of the file (pfio writes the entry, then the data);
  * get preads the entry, then the bytes; ReadOnlyFileCache mmaps the file and rejects a file
    with any empty slot.

Usage:
  pfio_compat.py write PATH LENGTH SKIP   put item(i) for every i with SKIP == 0 or i % SKIP != 0,
                                          in a scrambled order (so offsets are not in slot order)
  pfio_compat.py put PATH LENGTH SLOT [entry-only]
                                          one more put of item(SLOT) into an existing file, as a
                                          pfio process still filling it makes it: the entry at the
                                          end of the file, then the data; entry-only stops
                                          between the two (a pfio writer killed there, or caught
                                          in the middle of its put)
  pfio_compat.py check PATH LENGTH SKIP MODE
                                          MODE multiprocess: pread every slot, expect item(i) or
                                          empty as SKIP says; MODE readonly: mmap as
                                          ReadOnlyFileCache does (exit 3 on an empty slot)
Exit 0 on success, 1 on a mismatch, 3 when ReadOnlyFileCache would refuse the file.
"""
import mmap
import os
import struct
import sys

ENTRY = struct.Struct('<Qq')  # pfio packs 'Qq' in native order: little-endian on x86-64/aarch64


def item(i):
    """The same bytes as item_for_pfio() in cache_format_test.cpp."""
    size = (i * 37) % 300
    return bytes(((i * 131 + k * 7 + 97) & 0xFF) for k in range(size))


def expected_filled(i, skip):
    return skip == 0 or i % skip != 0


def write(path, length, skip):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(fd, ENTRY.pack(0, -1) * length, 0)  # MultiprocessFileCache.__init__
        order = sorted(range(length), key=lambda i: (i * 7919) % length)
        for i in order:
            if not expected_filled(i, skip):
                continue
            offset, size = ENTRY.unpack(os.pread(fd, ENTRY.size, ENTRY.size * i))
            if size != -1:
                print('slot %d already filled' % i)
                return 1
            data = item(i)
            pos = os.lseek(fd, 0, os.SEEK_END)
            os.pwrite(fd, ENTRY.pack(pos, len(data)), ENTRY.size * i)  # pfio: entry first
            os.pwrite(fd, data, pos)
        os.fsync(fd)
    finally:
        os.close(fd)
    return 0


def put(path, length, slot, entry_only):
    if not 0 <= slot < length:
        print('slot %d out of range' % slot)
        return 2
    fd = os.open(path, os.O_RDWR)
    try:
        offset, size = ENTRY.unpack(os.pread(fd, ENTRY.size, ENTRY.size * slot))
        if size != -1:
            print('slot %d already filled' % slot)
            return 1
        data = item(slot)
        pos = os.lseek(fd, 0, os.SEEK_END)
        os.pwrite(fd, ENTRY.pack(pos, len(data)), ENTRY.size * slot)  # pfio: entry first
        if not entry_only:
            os.pwrite(fd, data, pos)
    finally:
        os.close(fd)
    return 0


def check_multiprocess(path, length, skip):
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(length):
            offset, size = ENTRY.unpack(os.pread(fd, ENTRY.size, ENTRY.size * i))
            if size == -1:
                if expected_filled(i, skip):
                    print('slot %d empty, expected data' % i)
                    return 1
                continue
            data = os.pread(fd, size, offset)
            if not expected_filled(i, skip) or data != item(i):
                print('slot %d: wrong bytes (%d at %d)' % (i, size, offset))
                return 1
    finally:
        os.close(fd)
    print('ok %d slots' % length)
    return 0


def check_readonly(path, length, skip):
    with open(path, 'rb') as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        try:
            for i in range(length):
                offset, size = ENTRY.unpack_from(m, ENTRY.size * i)
                if size == -1:
                    print('ReadOnlyFileCache refuses: slot %d is empty' % i)
                    return 3
            for i in range(length):
                offset, size = ENTRY.unpack_from(m, ENTRY.size * i)
                if m[offset:offset + size] != item(i):
                    print('slot %d: wrong bytes' % i)
                    return 1
        finally:
            m.close()
    print('ok %d slots' % length)
    return 0


def main(argv):
    if len(argv) >= 5 and argv[1] == 'write':
        return write(argv[2], int(argv[3]), int(argv[4]))
    if len(argv) >= 5 and argv[1] == 'put':
        return put(argv[2], int(argv[3]), int(argv[4]), argv[5:6] == ['entry-only'])
    if len(argv) >= 6 and argv[1] == 'check':
        fn = check_readonly if argv[5] == 'readonly' else check_multiprocess
        return fn(argv[2], int(argv[3]), int(argv[4]))
    print(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv))
