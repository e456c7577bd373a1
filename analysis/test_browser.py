"""The report as a reader opens it: the smoke sweep's report.html in headless Chromium (Debian's chromium
and chromium-driver), screenshot kept, layout asserted from the DOM, each section found by its id."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

LAYOUT = """
const rect = (el) => el.getBoundingClientRect();
const collapsed = [...document.querySelectorAll('details.detail')].filter((d) => !d.open).length;
document.querySelectorAll('details').forEach((d) => { d.open = true; });  // as a reader opens them
const answer = document.querySelector('#answer h2');
const firstTable = document.querySelector('table');
const charts = [...document.querySelectorAll('figure svg')];
const columns = {};
for (const s of document.querySelectorAll('section[id], details.detail[id]')) {
  const table = s.querySelector(':scope > table');
  if (table) columns[s.id] = table.querySelectorAll('thead th').length;
}
return {
  collapsed: collapsed,
  columns: columns,
  answerTop: answer ? rect(answer).top + window.scrollY : null,
  tableTop: firstTable ? rect(firstTable).top + window.scrollY : null,
  text: document.body.innerText,
  charts: charts.map((s) => [rect(s).width, rect(s).height]),
  images: [...document.images].map((i) => i.complete && i.naturalWidth > 0),
};
"""


@pytest.mark.slow
def test_the_smoke_report_reads_right_in_a_browser(smoke_results: Path, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_path, "install Debian's chromium and chromium-driver (.ci/run does)"
    page = smoke_results / "smoke_full" / "report" / "report.html"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        browser.get(page.as_uri())
        layout = browser.execute_script(LAYOUT)
        browser.save_screenshot(str(tmp_path / "report.png"))
    finally:
        browser.quit()
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert layout["answerTop"] is not None and layout["answerTop"] < layout["tableTop"]  # the answer first
    assert "tiny_llama, " in layout["text"] and "scaling efficiency from 1 to 2 nodes" in layout["text"]
    for marker in ("**", "](", "|---", "\n- "):  # no Markdown shown as text
        assert marker not in layout["text"], marker
    assert layout["charts"] and all(w > 100 and h > 100 for w, h in layout["charts"])  # every chart drawn
    assert all(layout["images"])
    widths = layout["columns"]  # the rest is in the CSVs, and in the page's collapsed "every column"
    assert all(widths[i] <= 8 for i in ("nccl", "nccl_sizes", "comm_model", "predicted")), widths
    assert widths["step_split"] <= 16 and layout["collapsed"] > 0, layout["collapsed"]
    assert "predicted tokens/s/GPU" in layout["text"] and "largest miss" in layout["text"]
