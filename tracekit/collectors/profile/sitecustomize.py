"""Injected by ``tracekit profile`` (a copy of this file, alone in a private folder
put first on PYTHONPATH): load tracekit's profiler agent into this process, then
run the ``sitecustomize`` that the environment would have run without us.

Never raises: a problem here must not break the user's job (it is noted on stderr).
"""


def _tracekit_load_agent():
    import importlib.util
    import os
    import sys

    path = os.environ.get("TRACEKIT_PROFILE_AGENT")
    if not path or "_tracekit_profile_agent" in sys.modules:
        return
    try:
        spec = importlib.util.spec_from_file_location("_tracekit_profile_agent", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_tracekit_profile_agent"] = mod
        spec.loader.exec_module(mod)
        mod.install()
    except Exception as exc:  # noqa: BLE001 - never break the job
        sys.modules.pop("_tracekit_profile_agent", None)
        sys.stderr.write(f"tracekit profile: agent not loaded in pid {os.getpid()}: {type(exc).__name__}: {exc}\n")


def _tracekit_chain():
    """Run the next ``sitecustomize`` on sys.path (the one we shadow), if any."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    try:
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - as Python's site does: report and go on
        sys.stderr.write(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE for traceback:\n")
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")


_tracekit_load_agent()
_tracekit_chain()
