#!/usr/bin/env python3
"""After a failed ctest run: each failed test's own failure lines (pytest's short summary and
its first `E` lines, GoogleTest's failure messages, a timeout), a few per test, printed last so
that the tail of a CI log names what failed and why. Reads build/Testing/Temporary/LastTest.log
(or the path given)."""
import re
import sys

PER_TEST = 16
WANTED = re.compile(r"^(FAILED|ERROR) |^E {3}|\[  FAILED  \]|: Failure$|^Expected|^  Actual|Which is|"
                    r"^Value of|Timeout|Exception|Error:|^Test time")


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "build/Testing/Temporary/LastTest.log"
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError as error:
        print(f"test-failure-digest: {error}")
        return 0
    failed = 0
    for section in text.split("\n----------------------------------------------------------\n\n"):
        name = re.search(r"^\d+/\d+ Test: (.+)$", section, re.M)
        # A passed test's section says "Test Passed."; one skipped through the skip regex
        # (GoogleTest's SKIPPED) says "Test Pass Reason:" instead, which is no failure either.
        if name is None or "\nTest Passed." in section or "\nTest Pass Reason:" in section:
            continue
        failed += 1
        output = section.split("<end of output>")[0].splitlines()
        lines = [line for line in section.splitlines() if WANTED.search(line)]
        if len(lines) <= 1:  # no failure message: the output's last lines
            lines = output[-6:] + lines
        print(f"--- {name.group(1)}")
        for line in lines[:PER_TEST]:
            print("    " + line[:400])
    print(f"test-failure-digest: {failed} failed test(s) in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
