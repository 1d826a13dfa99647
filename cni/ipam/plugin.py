"""Entry point of the standalone `netagent-ipam` binary (ipam.type "netagent-ipam").

Lets other main plugins (bridge, ptp, macvlan, ...) use netagent's host-local compatible
IPAM the way they would use host-local. It is the same dispatcher the agent runs, given
the builtin handlers: (environment, stdin) in, (exit code, stdout) out. The installed
wrapper runs it as `python -I -S`, so this module and everything it imports stay stdlib
only.
"""
from __future__ import annotations

import os
import sys

from cni.config import ConfigScope
from cni.dispatch import execute
from cni.ipam.builtin import BuiltinIpam


def main() -> int:
    stdin = sys.stdin.buffer.read()
    code, out = execute(os.environ, stdin, BuiltinIpam(), scope=ConfigScope.IPAM)
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
