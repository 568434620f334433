#!/usr/bin/env python3
"""The longest functions of the shipped crates, by lines from `fn` to its closing brace.

    scripts/longest-functions.py [N] [DIR ...]

Reads the `src/` of every crate under `crates/` (or the folders given), leaves out
`#[cfg(test)]` modules, and prints the N longest functions (10 by default), longest first.
"""

import re
import sys
from pathlib import Path

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def functions(file: Path) -> list[tuple[int, str, int]]:
    """(length, name, first line) of every function of `file` outside test modules."""
    lines = file.read_text().split("\n")
    res, skip_to = [], -1
    for idx, line in enumerate(lines):
        if idx <= skip_to:
            continue
        if re.match(r"\s*#\[cfg\(test\)\]", line) and idx + 1 < len(lines) and re.match(r"\s*mod\s", lines[idx + 1]):
            skip_to = block_end(lines, idx + 1) or len(lines)
            continue
        match = FN.match(line)
        if not match:
            continue
        end = block_end(lines, idx)
        if end is not None:
            res.append((end - idx + 1, match.group(1), idx + 1))
    return res


def block_end(lines: list[str], start: int) -> int | None:
    """The line where the block opened at or after `start` closes; `None` for a declaration."""
    depth, opened = 0, False
    for idx in range(start, len(lines)):
        code = re.sub(r"'(?:\\.|[^'\\])'", "''", lines[idx])
        code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code).split("//")[0]
        for char in code:
            if char == "{":
                depth += 1
                opened = True
            elif char == "}":
                depth -= 1
            elif char == ";" and not opened and depth == 0:
                return None
        if opened and depth == 0:
            return idx
    return None


def main() -> None:
    args = sys.argv[1:]
    count = int(args.pop(0)) if args and args[0].isdigit() else 10
    roots = [Path(a) for a in args] or sorted(Path("crates").glob("*/src"))
    found = []
    for root in roots:
        for file in sorted(root.rglob("*.rs")):
            if "tests" in file.parts:
                continue
            found.extend((length, f"{file}:{line}", name) for length, name, line in functions(file))
    for length, place, name in sorted(found, reverse=True)[:count]:
        print(f"{length:5} {name:32} {place}")


if __name__ == "__main__":
    main()
