"""The docs' code blocks marked runnable (``<!-- runnable -->`` above the fence) run as written:
each page's blocks in order, in one namespace, from a scratch directory."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_RUNNABLE = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.DOTALL)


def _runnable_pages() -> list[Path]:
    return [p for p in PAGES if _RUNNABLE.search(p.read_text())]


def test_some_blocks_are_marked_runnable():
    assert {p.name for p in _runnable_pages()} >= {"README.md", "getting-started.md"}


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: p.name)
def test_the_runnable_blocks_of_the_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    namespace: dict = {"__name__": "docs_block"}
    for i, block in enumerate(_RUNNABLE.findall(page.read_text())):
        code = compile(block, f"{page.name}, runnable block {i + 1}", "exec")
        exec(code, namespace)
    assert os.getcwd() == str(tmp_path)


def test_the_options_page_is_generated_from_the_declarations():
    from autopar.ir.options import options_page

    page = ROOT / "docs" / "options.md"
    if os.environ.get("AUTOPAR_REGENERATE_DOCS") == "1":
        page.write_text(options_page())
    assert page.read_text() == options_page(), "docs/options.md is stale: see its first paragraph"
