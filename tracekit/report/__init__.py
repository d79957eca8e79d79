"""The report: the data (``data``: one connection, every section as plain rows), rendered for the
terminal (``data.print_report``), as HTML (``html``) and as a Perfetto trace (``perfetto``); the
run-to-run diff (``diff``) and the number formats they share (``textfmt``)."""
