"""python -m flashjit [--json]: info (flashjit.info). python -m flashjit SUBCOMMAND ...: the
flashjit CLI's subcommand (list, clear, precompile, prune, verify, bench), run as
flashjit.cache.run_cli runs it."""

import json
import sys

from . import cache
from .info import format_info, info


def main(argv):
    if not argv or argv in (["info"], ["--json"], ["info", "--json"]):
        result = info()
        print(json.dumps(result, indent=2) if "--json" in argv else format_info(result))
        return 0
    try:
        command = [cache.cli_path()] + argv
    except cache.CliNotFoundError as e:
        print(f"flashjit: {e}", file=sys.stderr)
        return 2
    import subprocess
    return subprocess.call(command, env=cache._cli_environment())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
