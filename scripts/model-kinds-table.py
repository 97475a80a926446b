#!/usr/bin/python3
"""model-kinds-table.py - put the model-kind matrix's table into README.md.

tests/integration/test_model_kinds.py (run with --upstream=real) writes the measured table to
tests/integration/artifacts/model-kinds.md; `scripts/record-figures.sh model-kinds` runs it and
keeps the table as bench/results/figures/model-kinds.md. This script replaces what README.md
holds between <!-- model-kinds:begin --> and <!-- model-kinds:end --> with that table.

Usage: /usr/bin/python3 scripts/model-kinds-table.py [TABLE.md] [--check]
       --check: exit 1 when README.md's table differs from TABLE.md, change nothing
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- model-kinds:begin -->", "<!-- model-kinds:end -->"


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--check"]
    table_path = Path(args[0]) if args else ROOT / "bench/results/figures/model-kinds.md"
    if not table_path.is_file():
        print(f"model-kinds-table: {table_path} not found: run scripts/record-figures.sh model-kinds "
              "first", file=sys.stderr)
        return 2
    table = table_path.read_text().strip() + "\n"
    readme = ROOT / "README.md"
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        print(f"model-kinds-table: README.md needs one {BEGIN} ... {END} block", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    new = f"{head}{BEGIN}\n{table}{END}{tail}"
    if "--check" in sys.argv[1:]:
        return 0 if new == text else 1
    if new != text:
        readme.write_text(new)
        print("model-kinds-table: README.md updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
