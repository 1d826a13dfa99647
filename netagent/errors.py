"""`NetagentError`: the one root of the project's own exceptions.

Every layer may import this module and nothing else of another layer's (tests/unit/project/test_layers.py
allows exactly it), so each layer's errors derive from it while keeping the bases their callers
catch (`ValueError`, `OSError`, `RuntimeError`). The CLI catches it once: a message on stderr
and exit code 1. It imports nothing, so importing it costs nothing and creates no cycle.
"""


class NetagentError(Exception):
    """An error of ours whose message is meant for the operator (no traceback needed)."""
