"""What `pip install -e '.[all,test]'` would need, against what this Python already has (no network needed).

`scripts/gpu_check.sh` runs it on the lent GPU machine, where nothing can be downloaded: turbotrain is
installed there with --no-deps on top of the image's own packages, so this lists what is missing or at
another version than pyproject.toml asks (and torch against the Makefile's tested pin). It only reports:
the exit status is 0 whatever it finds.

    python scripts/gpu_deps.py
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("all", "test")


def requirements(extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """pyproject.toml's dependencies plus those of ``extras``, self-references (turbotrain[data,...]) expanded."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out, todo, seen = list(project.get("dependencies", [])), list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional.get(extra, []):
            m = re.fullmatch(r"\s*turbotrain\s*\[([^\]]*)\]\s*", req)
            if m:
                todo += [e.strip() for e in m.group(1).split(",") if e.strip()]
            else:
                out.append(req)
    return out


def torch_pin() -> str | None:
    """The torch version the Makefile tests with (``TORCH ?= torch==X``)."""
    m = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), flags=re.M)
    return m.group(1) if m else None


def check(reqs: list[str]) -> list[tuple[str, str, str]]:
    """(status, name, detail) per requirement: status is ok, MISSING or OTHER (installed, outside the range)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging ships with pip's environment nearly everywhere
        Requirement = None
    rows = []
    for text in reqs:
        if Requirement is not None:
            req = Requirement(text)
            name, spec = req.name, req.specifier
        else:
            name, spec = re.split(r"[\s\[<>=!~;]", text, maxsplit=1)[0], None
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            rows.append(("MISSING", name, text))
            continue
        if spec is not None and not spec.contains(version, prereleases=True):
            rows.append(("OTHER", name, f"{version} installed, {text} asked"))
        else:
            rows.append(("ok", name, version))
    return rows


def main() -> int:
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    pin = torch_pin()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    if torch_version is None:
        print("torch: MISSING (nothing can run)")
    else:
        local = torch_version.split("+")[0]
        same = pin is None or local == pin
        print(f"torch: {torch_version}" + ("" if same else f"  (NOT the tested {pin}: the Makefile pins torch=={pin}; "
                                                          "results hold for this torch)"))
    rows = check(requirements())
    for status, name, detail in rows:
        print(f"  {status:8s}{name:18s}{detail}")
    missing = sorted({name for status, name, _ in rows if status == "MISSING"})
    other = sorted({name for status, name, _ in rows if status == "OTHER"})
    print(f"missing for .[{','.join(EXTRAS)}]: {', '.join(missing) or 'none'}; "
          f"outside the asked range: {', '.join(other) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
