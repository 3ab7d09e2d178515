"""No code outside `runinfra_opt/engine/` compares an engine's name: it asks the engine registry what the engine
can do (`EngineSpec`) or reads the engine's typed options, so the next engine needs no edit elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

from runinfra_opt.engine import registry

PACKAGE = Path(__file__).resolve().parents[1] / "runinfra_opt"


LOOP = re.compile(r"\bfor\s+[\w\s,()]+?\s+in\b")
"""`for NAME in`: a loop over a tuple of names is not a membership test."""


def comparisons(root: Path) -> list[str]:
    """`file:line: code` for every comparison with an engine's name in `root` outside its `engine/` folder:
    `== "vllm"`, `"vllm" != x`, `in ("vllm", ...)`, `not in ["transformers"]`, `case "vllm":`."""
    names = "|".join(re.escape(name) for name in registry.names())
    quoted = rf"""(?:"(?:{names})"|'(?:{names})')"""
    pattern = re.compile(rf"""[=!]=\s*{quoted}|{quoted}\s*[=!]=|\bin\s*[(\[{{][^)\]}}]*{quoted}|\bcase\s+{quoted}""")
    found = []
    for path in sorted(root.rglob("*.py")):
        if (root / "engine") in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(LOOP.sub("", line)):
                found.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return found


def test_no_engine_name_is_compared_outside_the_engine_package() -> None:
    assert comparisons(PACKAGE) == []


def test_the_check_catches_each_form(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "ok.py").write_text('if name == "vllm":\n    pass\n', encoding="utf-8")
    lines = [
        'if config.engine == "vllm":',
        "if engine != 'transformers':",
        'if "vllm" == engine:',
        'if engine in ("vllm", "sglang"):',
        'if engine not in ["transformers"]:',
        'ok = {"vllm": 1}.get(engine)',
        'print("the vllm engine")',
        'for column in ("vllm", "torch"):',
    ]
    (tmp_path / "leak.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    found = comparisons(tmp_path)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "5"]
