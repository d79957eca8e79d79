"""tracekit: where does a multi-GPU step's time go, and could the network do better?

The package is import-light on purpose: importing ``tracekit`` pulls neither
torch nor DuckDB, so ``tracekit analyze`` on an existing store starts fast.
"""

__version__ = "0.1.0"

SCHEMA_VERSION = "1.0"
"""Store schema version, ``MAJOR.MINOR``; a reader refuses a newer MAJOR."""
