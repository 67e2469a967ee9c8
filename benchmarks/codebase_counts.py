"""The codebase's shape in numbers: `python benchmarks/codebase_counts.py` (the duplicated runs: the `duplicates` tool).

Prints: the README's lines; dated figures (ISO dates) in README.md and docs/; sentences of over 60 words in docs/
(prose only: code blocks, tables and headings left out); source lines of the library and task packages; files a
new LRA task and a new mixer touch, as docs/architecture.md's recipes number them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_PACKAGES = ("kernels", "zoo", "lra_flax", "mt_flax", "mlm_flax", "studies")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def prose(text: str) -> str:
    """Markdown without code blocks, tables, headings and link targets."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(("|", "#", "    "))]
    return re.sub(r"\]\([^)]*\)", "]", "\n".join(lines))


def long_sentences(text: str, limit: int = 60) -> list[str]:
    """Sentences of over `limit` words; paragraphs and list items end sentences too."""
    paragraphs = re.split(r"\n\s*\n|\n\s*(?=[-*] |\d+\. )", prose(text))
    sentences = [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\[])", " ".join(p.split()))]
    return [s for s in sentences if len(s.split()) > limit]


def recipe_steps(text: str, heading: str) -> int:
    """The numbered steps under a docs/architecture.md heading."""
    section = text.split(heading, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return len(re.findall(r"^\d+\. ", section, flags=re.M))


def main() -> None:
    readme = (ROOT / "README.md").read_text()
    docs = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
    dated = {"README.md": len(DATE.findall(readme))} | {f"docs/{n}": len(DATE.findall(t)) for n, t in docs.items()}
    long = {f"docs/{n}": len(long_sentences(t)) for n, t in docs.items()}
    source = sum(len(p.read_text().splitlines()) for pkg in SOURCE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    architecture = docs.get("architecture.md", "")
    print(f"README.md lines: {len(readme.splitlines())}")
    print(f"dated figures (ISO dates) in README.md and docs/: {sum(dated.values())} "
          f"({', '.join(f'{k} {v}' for k, v in dated.items() if v)})")  # fmt: skip
    per_file = ", ".join(f"{k} {v}" for k, v in long.items() if v)
    print(f"sentences over 60 words in docs/: {sum(long.values())} ({per_file})")
    print(f"source lines ({', '.join(SOURCE_PACKAGES)}): {source}")
    for heading in ("### Add an LRA task", "### Add a mixer", "### Add a kernel backend"):
        if heading in architecture:
            print(f"{heading[4:]}: {recipe_steps(architecture, heading)} steps")


if __name__ == "__main__":
    main()
