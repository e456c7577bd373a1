"""Write docs/study.md's configuration reference from `bench/core/config.py` and the built-in launchers'
own sections (their fields' docstrings, types, ranges and defaults, as `python -m bench.sweep --help-config
--markdown` prints them), between the page's two markers. `--check`: write nothing, exit 1 where the page
differs (bench/test_docs.py checks the same).

    python scripts/config_docs.py [--check]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core.config_doc import in_page  # noqa: E402
from bench.launchers import BUILT_IN, launcher_sections  # noqa: E402

PAGE = ROOT / "docs" / "study.md"


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    wanted = in_page(page, launcher_sections(list(BUILT_IN)))
    if wanted == page:
        return 0
    if "--check" in argv:
        print(f"{PAGE.relative_to(ROOT)}: the configuration reference differs from bench/core/config.py; "
              "run python scripts/config_docs.py", file=sys.stderr)
        return 1
    PAGE.write_text(wanted)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
