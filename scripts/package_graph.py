"""The import graph of turbotrain: module-level cycles (a check) and the package picture (docs/architecture.md).

    python scripts/package_graph.py                      # lists cycles inside each package, exit 1 if any
    python scripts/package_graph.py --plot docs/img/package-graph.png

Every import counts, function-level ones too: a lazy import that only breaks a cycle at import time
still ties the two modules together for a reader.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "turbotrain"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """turbotrain modules ``path`` imports (resolved relative imports; ``from pkg import mod`` as pkg.mod)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # imports for type annotations only: no dependency at run time
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("turbotrain"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if (SRC.parent / (candidate.replace(".", "/") + ".py")).is_file()
                          or (SRC.parent / candidate.replace(".", "/")).is_dir() else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("turbotrain"))
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(SRC.rglob("*.py"))}


def cycles(edges: dict[str, set[str]], within: str) -> list[list[str]]:
    """Strongly connected components of more than one module among ``within``'s own modules."""
    nodes = [n for n in edges if n.startswith(within + ".") or n == within]
    sub = {n: {m for m in edges[n] if m in nodes and m != within} for n in nodes if n != within}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sub.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in sub:
        if n not in index:
            visit(n)
    return out


def top_level(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "turbotrain"


LAYERS = [["config", "yaml_io", "hardware", "distributed"], ["plan", "recipe"], ["speedups"],
          ["runtime", "measure", "data"], ["train", "launch", "setup"], ["doctor", "tuning", "bench"],
          ["commands", "demo", "cli"]]


def plot(edges: dict[str, set[str]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pkg_edges = defaultdict(set)
    for src, dsts in edges.items():
        for dst in dsts:
            a, b = top_level(src), top_level(dst)
            if a != b and a != "turbotrain" and b != "turbotrain":
                pkg_edges[a].add(b)
    where = {}
    for row, layer in enumerate(LAYERS):
        for col, name in enumerate(layer):
            where[name] = (col - (len(layer) - 1) / 2, -row)
    fig, ax = plt.subplots(figsize=(9, 7))
    for a, bs in pkg_edges.items():
        for b in bs:
            if a in where and b in where:
                (x1, y1), (x2, y2) = where[a], where[b]
                upward = y2 < y1
                ax.annotate("", xy=(x2, y2), xytext=(x1, y1),
                            arrowprops=dict(arrowstyle="->", color="#bbbbbb" if not upward else "#29335c",
                                            lw=0.8, shrinkA=14, shrinkB=14))
    for name, (x, y) in where.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=11,
                bbox=dict(boxstyle="round,pad=0.35", fc="#f3f3f3", ec="#29335c"))
    ax.set_xlim(-2, 2)
    ax.set_ylim(-len(LAYERS) + 0.5, 0.5)
    ax.axis("off")
    ax.set_title("turbotrain: who imports whom (foundations on top; dark arrows go against the layers)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="write the package picture to this PNG")
    args = parser.parse_args()
    edges = graph()
    found = {pkg: cycles(edges, f"turbotrain.{pkg}") for pkg in ("doctor", "tune", "bench", "data", "train", "launch")}
    found["turbotrain"] = [c for c in cycles(edges, "turbotrain") if any(m.count(".") == 1 for m in c)]
    for pkg, comps in found.items():
        for comp in comps:
            print(f"cycle in {pkg}: {' <-> '.join(comp)}")
    if args.plot:
        plot(edges, args.plot)
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
