#!/usr/bin/env python3
"""The largest import loop inside a crate: the largest strongly connected component of the
graph whose nodes are the crate's modules (one per file) and whose edges are the `crate::` and
`super::` paths each module's non-test code names.

    scripts/import-loops.py [--children] [crates/daemon/src]

Prints the size of the largest component and its modules, then every other component of two or
more. Comments and `#[cfg(test)]` modules are left out; a path names the deepest module it
reaches (`crate::call::ledger::Retry` names `call::ledger`, `crate::call::Door` names `call`).
With `--children`, a path that starts at a child module (`mcp::Settings` in `doors`) counts too.
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*(?:super|[A-Za-z_][A-Za-z0-9_]*))+)(\s*::\s*\{)?")


def module_of(root: Path, file: Path) -> tuple[str, ...]:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip(text: str) -> str:
    """The code without comments, string literals and `#[cfg(test)]` modules."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    out, idx = [], 0
    for match in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if match.start() < idx:
            continue
        out.append(text[idx : match.start()])
        depth, pos = 1, match.end()
        while depth and pos < len(text):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            pos += 1
        idx = pos
    out.append(text[idx:])
    return "".join(out)


def braces(text: str, start: int) -> list[str]:
    """The paths of a `{...}` group starting after its `{`, nested groups expanded."""
    depth, pos, item, items = 1, start, "", []
    while depth and pos < len(text):
        char = text[pos]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        if depth == 1 and char == ",":
            items.append(item)
            item = ""
        elif depth >= 1 and not (depth == 1 and char == "}"):
            item += char
        pos += 1
    items.append(item)
    paths = []
    for item in (i.strip() for i in items if i.strip()):
        if "{" in item:
            head, _, rest = item.partition("{")
            head = head.strip().rstrip(":").strip()
            for sub in braces(rest + "}", 0):
                paths.append(f"{head}::{sub}" if head else sub)
        else:
            paths.append(item.split(" as ")[0].strip())
    return paths


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--children"]
    children = "--children" in sys.argv[1:]
    root = Path(args[0] if args else "crates/daemon/src")
    files = sorted(root.rglob("*.rs"))
    modules = {module_of(root, f): f for f in files}
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for module, file in modules.items():
        code = strip(file.read_text())
        for match in PATH.finditer(code):
            kind = match.group(1)
            segments = [s.strip() for s in match.group(2).split("::") if s.strip()]
            tails = [[]]
            if match.group(3):
                tails = [[s.strip() for s in p.split("::") if s.strip()] for p in braces(code, match.end())]
            base = () if kind == "crate" else module
            if kind == "super":
                base = base[:-1]
            for tail in tails:
                path = list(base)
                for segment in segments + tail:
                    if segment == "super":
                        path = path[:-1]
                    elif segment != "self":
                        path.append(segment)
                # The deepest module the path reaches.
                target = None
                for end in range(len(path), -1, -1):
                    if tuple(path[:end]) in modules:
                        target = tuple(path[:end])
                        break
                if target is not None and target != module and target != ():
                    edges[module].add(target)
        if children:
            # Paths that start at a child module (`mcp::Settings` in `doors`).
            for match in re.finditer(r"(?<![:\w])([a-z_][a-z0-9_]*)\s*::", code):
                child = module + (match.group(1),)
                if child in modules:
                    edges[module].add(child)
    # Tarjan's strongly connected components, iteratively.
    index, low, on_stack, stack, comps, counter = {}, {}, set(), [], [], 0
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                comps.append(comp)
    comps = sorted((c for c in comps if len(c) > 1), key=len, reverse=True)
    name = lambda m: "::".join(m) or "crate"  # noqa: E731
    print(f"modules: {len(modules)}; largest import loop: {len(comps[0]) if comps else 1}")
    for comp in comps:
        print(f"  {len(comp)}: " + ", ".join(sorted(name(m) for m in comp)))


if __name__ == "__main__":
    main()
