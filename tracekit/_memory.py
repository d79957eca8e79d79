"""Keeping an ingest's resident memory down between its phases.

Two allocator effects made peak memory grow with the trace although every phase
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

``release_free_memory`` is best effort: elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_LIBC = None


def release_free_memory() -> None:
    """Return freed memory to the OS: pyarrow's pool, then glibc's heaps (``malloc_trim(0)``)."""
    global _LIBC
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001
        pass
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)
