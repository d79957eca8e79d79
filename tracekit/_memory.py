"""Keeping an ingest's resident memory down between its phases.

Three allocator effects made peak memory grow with the trace although every phase
streams (measured on hta_ddp_v100_r1of2 replicated ×16, 757 MB of JSON; see
benchmarks/README.md):

* pyarrow's default memory pool (mimalloc) keeps freed pages per thread: a plain
  scan of the staging file left ~60 MB resident while the pool counted 4 MB
  allocated. The ``tracekit`` command therefore sets ``ARROW_DEFAULT_MEMORY_POOL=system``
  before pyarrow is imported (pyarrow reads it once; ``pa.set_memory_pool`` does not
  reach the pool C++ code allocates from). Code that calls ``ingest_paths`` itself
  can set the same variable before importing pyarrow.
* glibc keeps freed heap memory that long-lived small blocks pin in place; what the
  reader freed (its JSON blocks and record arrays) then adds to what the link pass
  allocates. :func:`release_free_memory` hands free pages back to the OS
  (``malloc_trim``) between phases.
* glibc's thresholds move with the program: each large block freed raises the size
  below which blocks come from the heap (up to 32 MB), and with it the free space the
  heap may keep at its top before giving it back (twice that, up to 64 MB). After the
  reader's large blocks, what the link pass and the collectives freed stayed resident.
  :func:`cap_heap_retention` fixes that allowance at :data:`HEAP_TRIM_BYTES` from the
  link pass on: at ×64 (3 GB of JSON) ingest peaks went from 226–238 MiB to 197–220
  MiB (three runs each) for 2 % more time; 1 MB instead of 8 cost 8 %.

All are best effort: elsewhere than glibc the functions do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_LIBC = None

HEAP_TRIM_BYTES = 8 * 2**20
"""Free bytes glibc may keep at the top of its heap once :func:`cap_heap_retention` ran
(``M_TRIM_THRESHOLD``; the default is 128 KiB until the first large free, then moving)."""

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim
            _LIBC.mallopt
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def cap_heap_retention() -> None:
    """Fix glibc's top-of-heap allowance at HEAP_TRIM_BYTES for the rest of the process (this
    also stops glibc from moving its thresholds; see the module docstring)."""
    libc = _libc()
    if libc:
        libc.mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_BYTES)


def release_free_memory() -> None:
    """Return freed memory to the OS: pyarrow's pool, then glibc's heaps (``malloc_trim(0)``)."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001
        pass
    libc = _libc()
    if libc:
        libc.malloc_trim(0)
