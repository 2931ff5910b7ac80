"""The clinician page on the largest reference program, in a real browser: Debian's Chromium driven
by Selenium through Debian's chromedriver, against the real service (a `verdict serve api` process;
the scripted formalizer replays the recorded values of the pair).

A reviewer signs in through the login form, confirms an open condition and corrects an extracted
fact through the page's forms; the decision is re-derived each time (new decision ids, the page of
the newest shows it) and its history lists both changes. At 1,280 px nothing overflows, before and
after the review, collapsed and with every <details> open. Screenshots go to the test's tmp dir and
to /tmp/verdict_screens/ for a person to look at.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer
from verdict.serve.api_keys import KeyStore

from tests.serve.conftest import CHROMEDRIVER, CHROMIUM, selenium_chromium, start_service
from tests.serve.page_support import (
    LARGEST,
    LONGEST_NAME,
    SCRIPTED_MODELS,
    decide,
    miner_script,
    reference_pair,
)
from tests.support import need

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WIDTH = 1280
SCREENS = Path("/tmp/verdict_screens")

# Every element's right edge against the viewport (the test's own script: the page has none).
OVERFLOW_JS = """
const w = window.innerWidth, out = [];
for (const el of document.querySelectorAll('body *')) {
  const r = el.getBoundingClientRect();
  if (r.width > 0 && r.right > w + 0.5)
    out.push(el.tagName + '#' + el.id + '.' + el.className + ' ' + r.right);
}
return {scrollWidth: document.documentElement.scrollWidth, innerWidth: w, over: out.slice(0, 10),
        height: document.documentElement.scrollHeight};
"""


@pytest.fixture(scope="module")
def pairs():
    return reference_pair(LARGEST), reference_pair(LONGEST_NAME)


@pytest.fixture(scope="module")
def svc(tmp_path_factory, pairs):
    need(
        CHROMIUM.exists() and CHROMEDRIVER.exists(),
        "Chromium or chromedriver missing: apt-get install -y chromium chromium-driver",
    )
    pytest.importorskip("selenium", reason="selenium missing: pip install -e '.[dev]'")
    srv = ScriptedServer(Script.model_validate(miner_script(*pairs))).start()
    s = start_service(tmp_path_factory.mktemp("browser"), srv.url, {"formalizer": SCRIPTED_MODELS})
    s.keys["review"] = KeyStore(s.folder / "keys.json").add("dr-review", ["review"])[0]
    yield s
    s.stop()
    srv.stop()


@pytest.fixture()
def browser():
    drv = selenium_chromium(WIDTH, 900)
    yield drv
    drv.quit()


def check_fits(drv, shots: Path, name: str) -> None:
    """No horizontal scrolling and no element past the right edge, collapsed and with every
    <details> open; a full-page screenshot of each."""
    for state in ("collapsed", "expanded"):
        if state == "expanded":
            drv.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
        got = drv.execute_script(OVERFLOW_JS)
        assert got["innerWidth"] == WIDTH and got["scrollWidth"] <= got["innerWidth"], (name, state, got)
        assert got["over"] == [], (name, state, got)
        drv.set_window_size(WIDTH, min(got["height"] + 150, 30000))
        drv.save_screenshot(str(shots / f"{name}-{state}.png"))
        drv.set_window_size(WIDTH, 900)
    drv.refresh()  # back to the page as served (details closed)


def sign_in(drv, url: str, key: str, page: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    drv.get(f"{url}/login?next={page}")
    drv.find_element(By.NAME, "key").send_keys(key)
    drv.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    # click() can return before the form's navigation ends: wait for the redirect, not a clock
    WebDriverWait(drv, 30).until(lambda d: not d.current_url.startswith(f"{url}/login"))


def submit_review(drv, form_css: str, value: str, reason: str, **selects: str) -> None:
    """Open the form's <details>, fill it in and send it, as a person would."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import staleness_of
    from selenium.webdriver.support.ui import Select, WebDriverWait

    form = drv.find_element(By.CSS_SELECTOR, form_css)
    for d in form.find_elements(By.XPATH, "ancestor::details"):  # document order: outermost first
        if d.get_attribute("open") is None:
            d.find_element(By.XPATH, "./summary").click()
    field = form.find_element(By.NAME, "value")
    if field.tag_name == "select":
        Select(field).select_by_value(value)
    else:
        field.send_keys(value)
    for name, v in selects.items():
        Select(form.find_element(By.NAME, name)).select_by_value(v)
    form.find_element(By.NAME, "reason").send_keys(reason)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # click() returns before the POST's navigation ends (the server re-derives the decision first):
    # wait for the old page to go and the new one to load, not a clock
    WebDriverWait(drv, 60).until(staleness_of(form))
    WebDriverWait(drv, 60).until(lambda d: d.execute_script("return document.readyState") == "complete")


def test_review_through_the_page_forms_on_the_largest_reference_program(svc, pairs, browser, tmp_path):
    from selenium.webdriver.common.by import By

    pair = pairs[0]
    first = decide(svc, pair)
    page = first["links"]["page"]
    sign_in(browser, svc.url, svc.keys["review"], page)
    text = lambda css: browser.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
    assert text("#decision-id") == first["decision_id"] and text("#decision").lower() == "ineligible"
    assert "dr-review" in text("header.bar")
    # the style is applied (its CSP hash matches): fixed-layout tables, and the deciding rows first
    table = browser.find_element(By.CSS_SELECTOR, "#decisive")
    assert table.value_of_css_property("table-layout") == "fixed"
    violated = [lb["criterion"] for lb in first["decision"]["labels"] if lb["label"] == "violated"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#decisive tbody tr")
    assert [r.get_attribute("data-criterion") for r in rows] == violated
    assert not browser.find_element(By.CSS_SELECTOR, "#other").is_displayed()  # the rest, collapsed
    check_fits(browser, tmp_path, "1-before")

    # confirm a condition of "to confirm at the screening visit"
    confirmed = next(
        f.get_attribute("data-atom")
        for f in browser.find_elements(By.CSS_SELECTOR, "#confirm form[data-review=confirm]")
        if f.find_elements(By.CSS_SELECTOR, "select[name=value]")
    )  # a yes/no condition
    submit_review(
        browser,
        f"#confirm form[data-review=confirm][data-atom='{confirmed}']",
        "false",
        "asked at the screening visit",
        established="screening_visit",
    )
    assert "re-derived" in text("#notice")
    second = text("#decision-id")
    assert second != first["decision_id"]

    # correct a fact next to its highlighted evidence (a deciding criterion's)
    fact = browser.find_element(By.CSS_SELECTOR, "#decisive form[data-review=correct]")
    corrected = fact.get_attribute("data-atom")
    assert browser.find_elements(By.CSS_SELECTOR, f"mark[data-atoms~='{corrected}']")
    old = pair.values[corrected]["value"]
    new = str(not old).lower() if isinstance(old, bool) else "unknown"
    submit_review(
        browser, f"#decisive form[data-review=correct][data-atom='{corrected}']", new, "misread quote"
    )
    third = text("#decision-id")
    assert third not in (first["decision_id"], second)

    # the newest page shows the chain: three decisions, the two changes with their reasons
    entries = browser.find_elements(By.CSS_SELECTOR, "#history > li")
    assert [e.get_attribute("data-decision") for e in entries] == [first["decision_id"], second, third]
    changes = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#history [data-change]")]
    assert len(changes) == 2 and changes[0].startswith("confirmed ") and confirmed in changes[0]
    assert "= no at the screening visit; reason: asked at the screening visit" in changes[0]
    assert changes[1].startswith("corrected ") and corrected in changes[1] and "misread quote" in changes[1]
    # the API agrees: the same chain, re-derived with the changes applied
    with svc.client("review") as c:
        hist = c.get(f"/v1/decisions/{third}/history").json()
    assert [e["decision_id"] for e in hist["entries"]] == [first["decision_id"], second, third]
    assert [ch["type"] for e in hist["entries"] for ch in e["changes"]] == ["confirm", "correct"]
    # the older page says it is superseded and links to the newest
    browser.get(svc.url + page)
    assert (
        browser.find_element(By.CSS_SELECTOR, "#superseded a")
        .get_attribute("href")
        .endswith(f"/v1/decisions/{third}/page")
    )
    assert not browser.find_elements(By.CSS_SELECTOR, "form[data-review]")  # reviews go to the newest
    assert "supersedes" in text("#no-forms")
    browser.get(f"{svc.url}/v1/decisions/{third}/page")
    check_fits(browser, tmp_path, "2-after-review")

    # the program with the longest atom name fits too
    longest = decide(svc, pairs[1])
    browser.get(svc.url + longest["links"]["page"])
    check_fits(browser, tmp_path, "3-longest-atom-name")
    SCREENS.mkdir(parents=True, exist_ok=True)
    for png in sorted(tmp_path.glob("*.png")):
        shutil.copy(png, SCREENS / png.name)
