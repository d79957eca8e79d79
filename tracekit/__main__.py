from tracekit.cli import entry

entry()
