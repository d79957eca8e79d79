"""tracekit: where does a multi-GPU step's time go, and could the network do better?

The package is import-light on purpose: importing ``tracekit`` pulls neither
torch nor DuckDB, so ``tracekit analyze`` on an existing store starts fast.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """Lazy exports: ``tracekit.open(store)`` (the Python API), ``tracekit.profile`` (context
    manager) and ``tracekit.step()``, and ``tracekit.SCHEMA_VERSION`` (the store's,
    :data:`tracekit.store.SCHEMA_VERSION`), imported on first use so that ``import tracekit`` stays
    free of torch/DuckDB."""
    if name == "SCHEMA_VERSION":
        from tracekit.store import SCHEMA_VERSION

        return SCHEMA_VERSION
    if name == "open":  # the notebook API, tracekit/api.py
        from tracekit.api import open as open_

        globals()["open"] = open_
        return open_
    if name in ("profile", "step"):
        import importlib

        mod = importlib.import_module("tracekit.collectors.profile.session")
        # bind both names, replacing the submodule binding the import just made
        globals().update(profile=mod.profile, step=mod.step)
        return globals()[name]
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
