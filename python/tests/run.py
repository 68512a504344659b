"""Runs one of the package's test files with unittest and ends as ctest wants it: a closing
'N passed, N failed, N skipped' line, each skip's reason, exit 77 (ctest: Skipped) when every
test skipped, 1 on a failure. --skips FILE also writes the skip reasons there (tools/test.sh
prints them, since ctest shows nothing of a passing test)."""

import argparse
import sys
import unittest
from pathlib import Path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("test_file")
    parser.add_argument("--skips", help="write the skip reasons to this file")
    args = parser.parse_args()
    path = Path(args.test_file).resolve()
    sys.path.insert(0, str(path.parent))
    suite = unittest.defaultTestLoader.loadTestsFromName(path.stem)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    reasons = sorted({reason for _, reason in result.skipped})
    lines = [f"SKIPPED ({path.name}): {reason}" for reason in reasons]
    for line in lines:
        print(line)
    if args.skips:
        Path(args.skips).write_text("".join(line + "\n" for line in lines))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if failed:
        return 1
    return 77 if passed == 0 and skipped else 0


if __name__ == "__main__":
    sys.exit(main())
