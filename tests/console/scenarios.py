"""The console's browser checks: a real headless Chromium (Debian's `chromium` and
`chromium-driver`) driven through Selenium against a console that tests/tests/console.rs
started, with its fleet, Redis and dead letters.

    scenarios.py <scenario> <console url> <artifacts dir> [args...]

The token comes from the environment (CONSOLE_TOKEN), never from the command line. Each
scenario waits for what the page must show (a wait that runs out raises, with the page's text,
and the process exits 1), saves a screenshot of each page it visits under the artifacts
directory, and prints one JSON report as its last line for the Rust test to check (also saved
there as report-<scenario>.json).

Scenarios:
    pages                 the login, the fleet (the second toolbox, the hosted MCP server's
                          state) and the tools page with its search
    try-it <slow secs>    echo's try-it form: a wrong type is refused in the browser, then a
                          call is answered; a hosted MCP tool's progress; a slow command is
                          cancelled from the page; the calls page and a call's detail
    form                  form_probe's try-it form: enum, boolean, nested object and array
                          controls, errors at nested pointers, then a call
    dlq <replay id> <delete id>
                          the dead letters page: one letter replayed, one deleted
    script                a tool description holding <script> renders as text and never runs;
                          so does a result holding markup, on the try-it and the call's page
    refusals              no token, a wrong token, and POSTs without (or with a wrong) CSRF
                          token are refused; the same POST with it is accepted
    charts <tool> <markup tool>
                          the tools page's charts of the last hour: <tool>'s render with
                          points and update as new points come; <markup tool> (a name holding
                          markup, in a history point the test wrote) is shown as text; the
                          fleet page's per-replica charts render
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

# Generous: waits are polls that end as soon as the page shows what they wait for, and the
# machine may be busy (a build beside the tests on two cores).
WAIT_S = 60.0
CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CONSOLE_CHROMEDRIVER", "/usr/bin/chromedriver")


def browser() -> WebDriver:
    """Headless Chromium at a fixed window size (so screenshots are comparable), with the
    driver named explicitly: Selenium Manager is never asked to download anything."""
    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1366,900",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    return driver


class Console:
    """The console at `base`, seen through one browser, with screenshots saved to `artifacts`."""

    def __init__(self, base: str, artifacts: Path) -> None:
        self.base = base.rstrip("/")
        self.artifacts = artifacts
        self.token = os.environ["CONSOLE_TOKEN"]
        self.driver = browser()

    def close(self) -> None:
        self.driver.quit()

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def login(self) -> None:
        """`/?token=` sets the cookie and redirects to the fleet page."""
        self.open("/?token=" + self.token)
        self.wait(lambda: self.driver.current_url.endswith("/fleet"), "the login redirects to /fleet")

    def screenshot(self, name: str) -> str:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{name}.png"
        # The whole page, not only the window: the page's height plus the window's own frame.
        height = self.driver.execute_script(
            "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
            " + (window.outerHeight - window.innerHeight)"
        )
        self.driver.set_window_size(1366, max(900, min(int(height), 4000)))
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(1366, 900)
        return str(path)

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
        """Polls `condition` until it gives a true value, which is returned; raises naming
        `what`, with the page's URL and text, when `timeout` runs out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = condition()
            except Exception:  # an element not there yet, or replaced while read
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                body = self.driver.find_element(By.TAG_NAME, "body").text
                raise TimeoutException(f"{what}: not seen within {timeout} s on {self.driver.current_url}:\n{body}")
            time.sleep(0.1)

    def one(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        return self.one(css).text.strip()

    def csrf(self) -> str:
        return self.one('meta[name="csrf-token"]').get_attribute("content") or ""

    def call(self, what: str) -> tuple[str, Any]:
        """Clicks the try-it form's Call and waits for the answer: the request id and answer."""
        self.one("button#call").click()
        self.wait(lambda: self.text("span#call-state") == "answered", what)
        return self.text("span#request-id"), json.loads(self.text("pre#result"))

    def nav(self, link: str, path: str) -> None:
        """Follows a nav link and waits for its page."""
        self.one(f"a#nav-{link}").click()
        self.wait(lambda: self.driver.current_url.endswith(path), f"the {link} link leads to {path}")


def http(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: Any = None
) -> tuple[int, dict[str, str], str]:
    """One HTTP request without cookies and without following redirects: status, headers (by
    lower-case name), body."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=WAIT_S) as response:
            return response.status, lower(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, lower(error.headers), error.read().decode()


def lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def cell(row: WebElement, css: str) -> str:
    """The text of a cell of `row`, also while the row is hidden (by a filter), where
    Selenium's `.text` gives ""."""
    return (row.find_element(By.CSS_SELECTOR, css).get_attribute("textContent") or "").strip()


def fleet_rows(console: Console) -> dict[str, Any]:
    """What the fleet page shows, as data."""
    return {
        "toolboxes": [
            {
                "toolbox": row.get_attribute("data-toolbox"),
                "replica": row.get_attribute("data-replica"),
                "tools": row.find_element(By.CSS_SELECTOR, "td.tools").text.strip(),
            }
            for row in console.all("table#toolboxes tr[data-toolbox]")
        ],
        "sources": [
            {
                "source": row.get_attribute("data-source"),
                "toolbox": row.get_attribute("data-toolbox"),
                "state": row.find_element(By.CSS_SELECTOR, "td.state").text.strip(),
                "kind": row.find_element(By.CSS_SELECTOR, "td.kind").text.strip(),
            }
            for row in console.all("table#sources tr[data-source]")
        ],
        "conflicts": [
            {
                "tool": row.get_attribute("data-tool"),
                "hash": row.find_elements(By.TAG_NAME, "td")[1].text.strip(),
                "toolboxes": row.find_elements(By.TAG_NAME, "td")[2].text.strip(),
            }
            for row in console.all("table#conflicts tr[data-tool]")
        ],
        "redis_topology": console.text("span#redis-topology"),
        "redis_health": console.text("span#redis-health"),
        "groups": [
            {
                "stream": row.get_attribute("data-stream"),
                "group": row.get_attribute("data-group"),
                "pending": row.find_element(By.CSS_SELECTOR, "td.pending").text.strip(),
                "lag": row.find_element(By.CSS_SELECTOR, "td.lag").text.strip(),
            }
            for row in console.all("table#groups tr[data-group]")
        ],
    }


def pages(console: Console) -> dict[str, Any]:
    """The login, the fleet page and the tools page."""
    report: dict[str, Any] = {}
    # Before the login a page is refused, and says so.
    console.open("/fleet")
    report["before_login"] = console.one("body").text
    console.login()

    # The hosted MCP server starts with the toolbox, so it may still be `starting`: the page is
    # read again until it is `up` (the fleet is read at each load).
    def everything_up() -> bool:
        console.open("/fleet")
        state = console.text('table#sources tr[data-source="everything"] td.state')
        return state == "up" and bool(console.all('table#toolboxes tr[data-toolbox="second"]'))

    console.wait(everything_up, "the second toolbox and the hosted server `everything` up")
    report["fleet"] = fleet_rows(console)
    report["screenshot_fleet"] = console.screenshot("fleet")

    console.nav("tools", "/tools")
    report["tools"] = [row.get_attribute("data-tool") for row in console.all("table#tools tr[data-tool]")]
    search = console.one("input#tool-search")
    search.send_keys("everything__")

    def shown() -> list[str]:
        return [
            row.get_attribute("data-tool") or ""
            for row in console.all("table#tools tr[data-tool]")
            if row.is_displayed()
        ]

    console.wait(lambda: shown() and all(name.startswith("everything__") for name in shown()), "the search filters")
    report["search_everything"] = shown()
    report["screenshot_tools"] = console.screenshot("tools")
    return report


def try_it(console: Console, slow_seconds: str) -> dict[str, Any]:
    """echo's try-it form (a wrong type, then a call), progress, a cancelled slow call, the calls
    page."""
    report: dict[str, Any] = {}
    console.login()
    console.open("/tools/echo")
    console.wait(lambda: console.text("h1#tool-name") == "echo", "echo's page")
    report["input_schema"] = json.loads(console.text("pre#input-schema"))

    # Raw JSON with a number where echo takes a string: refused in the browser, nothing sent.
    console.wait(lambda: console.all('form#try-it [data-pointer="/message"]'), "the generated form")
    console.one("input#use-raw").click()
    raw = console.wait(lambda: console.one("textarea#raw-args"), "the raw JSON box")
    console.wait(lambda: raw.is_displayed(), "the raw JSON box shown")
    raw.clear()
    raw.send_keys('{"message": 5}')
    console.one("button#call").click()
    error = console.wait(lambda: console.one('ul#errors > li[data-pointer="/message"]'), "an error at /message")
    report["wrong_type_error"] = error.text.strip()
    report["wrong_type_request_id"] = console.text("span#request-id")
    report["wrong_type_state"] = console.text("span#call-state")

    # Back to the form: the text field for `message`, then a call that is answered.
    console.one("input#use-raw").click()
    field = console.wait(lambda: console.one('form#try-it input[data-pointer="/message"]'), "the message field")
    console.wait(lambda: field.is_displayed(), "the message field shown")
    field.clear()
    field.send_keys("hello from the console")
    report["echo_request_id"], report["echo_result"] = console.call("echo answered")
    report["echo_errors_left"] = len(console.all("ul#errors > li"))
    report["screenshot_try_it"] = console.screenshot("try-it")

    # A hosted MCP tool answering an image between two texts: the image shown as an image (a
    # data: URL the browser decoded), the texts as text.
    console.open("/tools/everything__get-tiny-image")
    console.wait(lambda: console.text("h1#tool-name") == "everything__get-tiny-image", "get-tiny-image's page")
    _, report["image_answer"] = console.call("get-tiny-image answered")
    image = console.wait(lambda: console.one("div#blocks img.block-image"), "the image block")
    console.wait(lambda: console.driver.execute_script("return arguments[0].naturalWidth", image) > 0, "the image decoded")
    report["image_block"] = {
        "natural_width": console.driver.execute_script("return arguments[0].naturalWidth", image),
        "src_prefix": (image.get_attribute("src") or "")[:22],
        "texts": [node.text for node in console.all("div#blocks pre.block-text")],
    }
    report["screenshot_image"] = console.screenshot("try-it-image")

    # A hosted MCP tool that reports progress: its entries are listed as they come, then the
    # answer. Its arguments are numbers: text in a number field is refused first.
    console.open("/tools/everything__trigger-long-running-operation")
    fields = {}
    for pointer in ("/duration", "/steps"):
        fields[pointer] = console.wait(
            lambda: console.one(f'form#try-it input[data-pointer="{pointer}"]'), f"the {pointer} field"
        )
    report["number_fields"] = {
        pointer: {"type": field.get_attribute("type"), "data_type": field.get_attribute("data-type")}
        for pointer, field in fields.items()
    }
    fields["/duration"].clear()
    fields["/duration"].send_keys("two")
    fields["/steps"].clear()
    fields["/steps"].send_keys("4")
    console.one("button#call").click()
    error = console.wait(lambda: console.one('ul#errors > li[data-pointer="/duration"]'), "an error at /duration")
    report["text_in_number_error"] = error.text.strip()
    report["text_in_number_request_id"] = console.text("span#request-id")
    fields["/duration"].clear()
    fields["/duration"].send_keys("2")
    _, report["progress_result"] = console.call("the long-running operation answered")
    report["progress"] = [item.text.strip() for item in console.all("ol#progress > li")]
    report["screenshot_progress"] = console.screenshot("try-it-progress")

    # A slow command, cancelled from the page once its process runs.
    console.open("/tools/slow_sleep")
    seconds = console.wait(lambda: console.one('form#try-it input[data-pointer="/seconds"]'), "the seconds field")
    seconds.clear()
    seconds.send_keys(slow_seconds)
    console.one("button#call").click()
    console.wait(lambda: console.text("span#call-state") == "running", "the slow call running")
    cancel = console.one("button#cancel")
    console.wait(cancel.is_enabled, "Cancel enabled while the call runs")
    # The daemon has read the call when its `sleep` runs: a cancel sent before that would find
    # no call to stop (CONTRACTS: a cancel is not remembered).
    console.wait(lambda: sleep_pids(slow_seconds), f"a `sleep {slow_seconds}` process", timeout=WAIT_S)
    cancel.click()
    console.wait(lambda: console.text("span#call-state") == "cancelled", "the slow call cancelled")
    report["slow_request_id"] = console.text("span#request-id")
    report["slow_result"] = json.loads(console.text("pre#result"))
    report["slow_cancel_enabled_after"] = console.one("button#cancel").is_enabled()
    console.wait(lambda: not sleep_pids(slow_seconds), "the `sleep` process gone after the cancel")
    report["screenshot_cancelled"] = console.screenshot("try-it-cancelled")

    # The tools' statistics (`tools.stats` of each hosting toolbox), read again at each load:
    # echo's call, and slow_sleep's cancel among its error codes.
    def stats(tool: str) -> list[dict[str, str]]:
        console.open("/tools/" + tool)
        return [
            {
                "toolbox": row.get_attribute("data-toolbox") or "",
                "calls": cell(row, "td.calls"),
                "errors": cell(row, "td.errors") if row.find_elements(By.CSS_SELECTOR, "td.errors") else "",
                "p50": cell(row, "td.p50") if row.find_elements(By.CSS_SELECTOR, "td.p50") else "",
                "p99": cell(row, "td.p99") if row.find_elements(By.CSS_SELECTOR, "td.p99") else "",
            }
            for row in console.all("table#tool-stats tr[data-toolbox]")
        ]

    def echo_counted() -> list[dict[str, str]] | None:
        rows = stats("echo")
        return rows if sum(int(row["calls"] or 0) for row in rows) >= 1 else None

    def cancel_counted() -> list[dict[str, str]] | None:
        rows = stats("slow_sleep")
        return rows if any("cancelled" in row["errors"] for row in rows) else None

    report["echo_stats"] = console.wait(echo_counted, "echo's call in its statistics")
    report["slow_stats"] = console.wait(cancel_counted, "slow_sleep's cancel in its statistics")

    # The calls page lists both calls, newest first; the filter narrows it; a call's detail.
    console.nav("calls", "/calls")
    def calls() -> list[dict[str, str]]:
        return [
            {
                "request_id": row.get_attribute("data-request-id") or "",
                "tool": cell(row, "td.tool"),
                "tenant": cell(row, "td.tenant"),
                "door": cell(row, "td.door"),
                "outcome": cell(row, "td.outcome"),
                "displayed": str(row.is_displayed()).lower(),
            }
            for row in console.all("table#calls tr[data-request-id]")
        ]

    # Each toolbox that read a call logs it; the one that ran it logs its outcome.
    def logged() -> bool:
        seen = {(row["request_id"], row["outcome"]) for row in calls()}
        return (report["echo_request_id"], "success") in seen and (report["slow_request_id"], "cancelled") in seen

    console.wait(logged, "both calls' outcomes on the calls page")
    report["calls"] = calls()
    report["screenshot_calls"] = console.screenshot("calls")
    console.one("input#calls-filter").send_keys("slow_sleep")
    console.wait(
        lambda: all(row["tool"] == "slow_sleep" for row in calls() if row["displayed"] == "true"),
        "the calls filter",
    )
    report["calls_filtered"] = [row["request_id"] for row in calls() if row["displayed"] == "true"]

    # Live: a call made while the page is open is added to it without a reload, and the filter
    # applies to it (an `echo` row stays hidden under "slow_sleep").
    console.driver.execute_script("window.__sameCallsPage = true")
    sent = console.driver.execute_async_script(
        """
        const [csrf, done] = arguments;
        fetch('/api/call', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf},
                            body: JSON.stringify({tool: 'echo', arguments: {message: 'live on the calls page'}})})
            .then(r => r.json()).then(done).catch(e => done({error: String(e)}));
        """,
        console.csrf(),
    )
    live_id = sent.get("request_id", "")
    console.wait(
        lambda: any(row["request_id"] == live_id and row["outcome"] == "success" for row in calls()),
        "the call made meanwhile, live",
    )
    report["live_request_id"] = live_id
    report["live_rows"] = [row for row in calls() if row["request_id"] == live_id]
    report["live_same_page"] = console.driver.execute_script("return window.__sameCallsPage === true")
    echo_row = next(
        row
        for row in console.all(f'table#calls tr[data-request-id="{report["echo_request_id"]}"]')
        if cell(row, "td.outcome") == "success"
    )
    console.driver.get(echo_row.find_element(By.CSS_SELECTOR, "a.call-link").get_attribute("href") or "")
    console.wait(lambda: console.text("span#call-outcome"), "the call's detail")
    report["detail_outcome"] = console.text("span#call-outcome")
    report["detail_answer"] = console.text("pre#call-answer") if console.all("pre#call-answer") else ""
    report["detail_request"] = console.text("pre#call-request")
    report["detail_deliveries"] = console.text("span#call-deliveries")
    report["detail_timings"] = console.text("dl#call-timings")
    report["screenshot_call_detail"] = console.screenshot("call-detail")
    return report


def form(console: Console) -> dict[str, Any]:
    """form_probe's try-it form: an enum, a boolean, a nested object and an array, each with
    its control; errors inside the nested object named by their pointers before anything is
    sent; array items added, removed and renumbered; then the call and its answer."""
    report: dict[str, Any] = {}
    console.login()
    console.open("/tools/form_probe")
    console.wait(lambda: console.all('form#try-it [data-pointer="/tags"]'), "form_probe's form")

    def control(pointer: str) -> WebElement:
        return console.one(f'form#try-it [data-pointer="{pointer}"]')

    report["controls"] = {
        pointer: {
            "tag": control(pointer).tag_name,
            "type": control(pointer).get_attribute("type") or "",
            "data_type": control(pointer).get_attribute("data-type"),
        }
        for pointer in ("/level", "/urgent", "/target", "/target/host", "/target/port", "/tags")
    }
    report["level_options"] = [option.text for option in control("/level").find_elements(By.TAG_NAME, "option")]

    # Three items, the first removed: the others take its place and pointer.
    add = control("/tags").find_element(By.CSS_SELECTOR, "button.add")
    for _ in range(3):
        add.click()
    console.wait(lambda: console.all('form#try-it input[data-pointer="/tags/2"]'), "three items")
    for index, text in enumerate(("dropped", "x", "y")):
        control(f"/tags/{index}").send_keys(text)
    control("/tags").find_element(By.CSS_SELECTOR, ".item button.remove").click()
    console.wait(lambda: not console.all('form#try-it [data-pointer="/tags/2"]'), "the first item removed")
    report["tags_after_remove"] = [
        control(f"/tags/{index}").get_attribute("value") for index in range(2)
    ]
    report["tag_labels_after_remove"] = [
        label.text.strip() for label in console.all('form#try-it [data-pointer="/tags"] .item > .field > label')
    ]

    # The host left empty and text for the port: both refused in the browser, each at its
    # pointer inside the nested object, marked beside its field; nothing is sent.
    control("/level").find_elements(By.TAG_NAME, "option")[1].click()
    control("/urgent").click()
    control("/target/port").send_keys("eighty")
    console.one("button#call").click()
    console.wait(lambda: console.all("ul#errors > li"), "the errors")
    report["errors"] = {
        item.get_attribute("data-pointer"): item.text.strip() for item in console.all("ul#errors > li")
    }
    report["marked"] = {
        pointer: {
            "invalid": control(pointer).get_attribute("aria-invalid"),
            "note": (
                console.one(f'form#try-it .field-error[data-pointer="{pointer}"]').text.strip()
                if console.all(f'form#try-it .field-error[data-pointer="{pointer}"]')
                else ""
            ),
        }
        for pointer in ("/target/host", "/target/port")
    }
    report["errors_request_id"] = console.text("span#request-id")
    report["screenshot_form_errors"] = console.screenshot("try-it-form-errors")

    # Then a port out of bounds, then a valid one: the call is answered with what `cat` read.
    control("/target/host").send_keys("db.internal")
    port = control("/target/port")
    port.clear()
    port.send_keys("70000")
    console.one("button#call").click()
    console.wait(lambda: console.all('ul#errors > li[data-pointer="/target/port"]'), "the bound refused")
    report["bound_error"] = console.text('ul#errors > li[data-pointer="/target/port"]')
    report["bound_request_id"] = console.text("span#request-id")
    port.clear()
    port.send_keys("5432")
    report["request_id"], report["result"] = console.call("form_probe answered")
    report["errors_left"] = len(console.all("ul#errors > li")) + len(console.all("form#try-it .field-error"))
    report["invalid_left"] = len(console.all('form#try-it [aria-invalid="true"]'))
    report["screenshot_form"] = console.screenshot("try-it-form")
    return report


def sleep_pids(seconds: str) -> list[int]:
    """The processes running `sleep <seconds>` on this machine (the slow tool's command)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 2 and argv[0].endswith(b"sleep") and argv[1] == seconds.encode():
            pids.append(int(entry.name))
    return pids


def dlq(console: Console, replay_id: str, delete_id: str) -> dict[str, Any]:
    """Two dead letters (by their request ids): one replayed, one deleted, from the page."""
    report: dict[str, Any] = {}
    console.login()
    console.nav("dlq", "/dlq")

    def row_of(request_id: str) -> WebElement | None:
        for row in console.all("table#dead-letters tr[data-dlq-id]"):
            if row.find_element(By.CSS_SELECTOR, "td.request-id").text.strip() == request_id:
                return row
        return None

    for name, request_id in (("replay", replay_id), ("delete", delete_id)):
        row = console.wait(lambda: row_of(request_id), f"the dead letter of {request_id}")
        report[name] = {
            "dlq_id": row.get_attribute("data-dlq-id"),
            "toolbox": row.get_attribute("data-toolbox"),
            "error": row.find_element(By.CSS_SELECTOR, "td.error").text.strip(),
        }
    report["screenshot_dlq"] = console.screenshot("dlq")

    # Inspect the letter to replay.
    link = row_of(replay_id).find_element(By.CSS_SELECTOR, "a.letter-link")  # type: ignore[union-attr]
    link.click()
    letter = console.wait(lambda: console.text("pre#letter"), "the letter's page")
    report["letter"] = json.loads(letter)
    report["screenshot_letter"] = console.screenshot("dlq-letter")
    console.driver.back()

    for name, request_id, button in (("replay", replay_id, "button.replay"), ("delete", delete_id, "button.delete")):
        row = console.wait(lambda: row_of(request_id), f"the dead letter of {request_id} again")
        row.find_element(By.CSS_SELECTOR, button).click()
        # Some consoles ask before they act; accept the question if there is one.
        try:
            console.driver.switch_to.alert.accept()
        except NoAlertPresentException:
            pass
        console.wait(lambda: row_of(request_id) is None, f"the {name}d letter's row gone")
        report[name]["flash"] = console.wait(lambda: console.text("div#flash"), f"the {name} flash")
    # The page read again: neither letter is there any more.
    console.open("/dlq")
    console.wait(lambda: console.all("table#dead-letters"), "the dead letters page again")
    report["rows_after"] = [
        row.find_element(By.CSS_SELECTOR, "td.request-id").text.strip()
        for row in console.all("table#dead-letters tr[data-dlq-id]")
    ]
    return report


SCRIPT_FLAG = "__consoleXss"


def script(console: Console) -> dict[str, Any]:
    """The tool `html_note`, whose description holds a <script> and an <img onerror>, both of
    which would set window.__consoleXss if they ran."""
    report: dict[str, Any] = {}
    console.login()
    console.open("/tools")
    listed = console.wait(lambda: console.one('table#tools tr[data-tool="html_note"] td.description'), "html_note")
    report["list_text"] = listed.text
    report["list_elements"] = console.driver.execute_script(
        "return arguments[0].querySelectorAll('script, img').length", listed
    )
    report["list_flag"] = flag(console)
    console.open("/tools/html_note")
    description = console.wait(lambda: console.one("p#tool-description"), "html_note's page")
    time.sleep(0.5)  # an <img onerror> would fire once the image fails to load
    report["detail_text"] = description.text
    report["detail_elements"] = console.driver.execute_script(
        "return arguments[0].querySelectorAll('script, img').length", description
    )
    report["detail_flag"] = flag(console)
    # Scripts on the page at all: only the console's own, from /static/.
    report["page_scripts"] = console.driver.execute_script(
        "return Array.from(document.scripts).map(s => s.src || ('inline:' + s.textContent.slice(0, 60)))"
    )
    report["screenshot_script"] = console.screenshot("tool-script-description")

    # A result holding markup: put into the try-it page by the script, and into the call's page
    # by the server (its request and its answer), as text each time.
    text_field = console.wait(lambda: console.one('form#try-it input[data-pointer="/text"]'), "the text field")
    text_field.send_keys(RESULT_MARKUP)
    request_id, report["result"] = console.call("html_note answered")
    time.sleep(0.5)
    report["result_text"] = console.text("pre#result")
    report["result_elements"] = console.driver.execute_script(
        "return document.querySelectorAll('main script, main img').length"
    )
    report["result_flag"] = flag(console)
    console.nav("calls", "/calls")
    row = console.wait(
        lambda: next(
            (row for row in console.all(f'table#calls tr[data-request-id="{request_id}"]')
             if cell(row, "td.outcome") == "success"),
            None,
        ),
        "html_note's call on the calls page",
    )
    console.driver.get(row.find_element(By.CSS_SELECTOR, "a.call-link").get_attribute("href") or "")
    console.wait(lambda: console.text("span#call-outcome"), "the call's detail")
    time.sleep(0.5)
    report["call_request_text"] = console.text("pre#call-request")
    report["call_answer_text"] = console.text("pre#call-answer")
    report["call_elements"] = console.driver.execute_script(
        "return document.querySelectorAll('main script, main img').length"
    )
    report["call_flag"] = flag(console)
    report["screenshot_script_result"] = console.screenshot("call-markup-result")
    try:
        report["alert"] = console.driver.switch_to.alert.text
    except NoAlertPresentException:
        report["alert"] = None
    return report


# What html_note is called with: markup that would set window.__consoleXss if it ran.
RESULT_MARKUP = '<img src="y" onerror="window.__consoleXss = 3"><script>window.__consoleXss = 4</script>'


def flag(console: Console) -> str | None:
    """window.__consoleXss, which only markup that ran would have set."""
    return console.driver.execute_script(
        f"return window.{SCRIPT_FLAG} === undefined ? null : String(window.{SCRIPT_FLAG})"
    )


def charts(console: Console, tool: str, markup_tool: str) -> dict[str, Any]:
    """The charts on the tools and fleet pages, drawn by the script from /api/history."""
    report: dict[str, Any] = {}
    console.login()
    console.open("/tools")
    group = f'section#charts-tools div.chart-group[data-tool="{tool}"]'
    console.wait(lambda: console.one(f"{group} figure.chart svg polyline"), f"{tool}'s charts")
    figures = console.all(f"{group} figure.chart")
    report["captions"] = [figure.find_element(By.CSS_SELECTOR, "figcaption").text for figure in figures]
    report["series"] = console.driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' polyline')).map(p => p.getAttribute('data-series'))",
        group,
    )
    first = int(figures[0].get_attribute("data-points") or "0")
    report["points_first"] = first
    report["updates_first"] = int(console.one("section#charts-tools").get_attribute("data-updated") or "0")
    # New points come every 5 s; the page redraws with them.
    console.wait(
        lambda: int(console.one(f"{group} figure.chart").get_attribute("data-points") or "0") > first or None,
        "a new point on the chart",
    )
    report["points_later"] = int(console.one(f"{group} figure.chart").get_attribute("data-points") or "0")
    report["updates_later"] = int(console.one("section#charts-tools").get_attribute("data-updated") or "0")
    # The tool name holding markup: its heading is text, nothing of it became an element.
    headings = console.wait(
        lambda: [h.text for h in console.all("section#charts-tools h3.chart-tool") if "<" in h.text] or None,
        "the chart of the tool whose name holds markup",
    )
    report["markup_heading"] = headings[0]
    report["markup_elements"] = console.driver.execute_script(
        "return document.querySelectorAll('section#charts-tools img, section#charts-tools script, #injected').length"
    )
    report["markup_flag"] = flag(console)
    report["empty_hidden"] = console.driver.execute_script(
        "return document.querySelector('section#charts-tools .charts-empty').hidden"
    )
    report["screenshot_tools_charts"] = console.screenshot("tools-charts")
    # The charts alone (docs/console-charts.png is one of these).
    section = console.artifacts / "tools-charts-section.png"
    console.one("section#charts-tools").screenshot(str(section))
    report["screenshot_tools_charts_section"] = str(section)
    console.nav("fleet", "/fleet")
    console.wait(lambda: console.one("section#charts-replicas div.chart-group svg polyline"), "the replicas' charts")
    report["replicas"] = console.driver.execute_script(
        "return Array.from(document.querySelectorAll('section#charts-replicas div.chart-group')).map(g => g.getAttribute('data-replica'))"
    )
    report["replica_series"] = console.driver.execute_script(
        "return Array.from(document.querySelectorAll('section#charts-replicas div.chart-group')[0].querySelectorAll('polyline')).map(p => p.getAttribute('data-series'))"
    )
    report["screenshot_fleet_charts"] = console.screenshot("fleet-charts")
    return report


def refusals(console: Console) -> dict[str, Any]:
    """No token, a wrong token, and POSTs without the CSRF token, with plain HTTP and from the
    browser's own session."""
    base = console.base
    bearer = {"Authorization": "Bearer " + console.token}
    report: dict[str, Any] = {}

    def record(status: int, headers: dict[str, str], body: str) -> dict[str, Any]:
        return {
            "status": status,
            "body": body[:400],
            "csp": headers.get("content-security-policy"),
        }

    report["page_no_token"] = record(*http(base + "/fleet"))
    report["api_no_token"] = record(*http(base + "/api/fleet"))
    report["login_wrong_token"] = record(*http(base + "/?token=not-the-token-0123456789"))
    report["page_wrong_bearer"] = record(*http(base + "/fleet", headers={"Authorization": "Bearer not-the-token-0123456789"}))
    report["api_bearer"] = record(*http(base + "/api/fleet", headers=bearer))
    status, headers, _ = http(base + "/?token=" + console.token)
    report["login"] = {"status": status, "location": headers.get("location"), "set_cookie": headers.get("set-cookie")}

    # The CSRF token of a page fetched with the bearer token.
    status, _, page = http(base + "/fleet", headers=bearer)
    marker = 'name="csrf-token" content="'
    csrf = page.split(marker, 1)[1].split('"', 1)[0] if marker in page else ""
    report["csrf_found"] = bool(csrf)
    call = {"tool": "echo", "arguments": {"message": "csrf check"}}
    report["post_no_csrf"] = record(*http(base + "/api/call", "POST", bearer, call))
    report["post_wrong_csrf"] = record(*http(base + "/api/call", "POST", {**bearer, "X-CSRF-Token": "wrong"}, call))
    report["post_with_csrf"] = record(*http(base + "/api/call", "POST", {**bearer, "X-CSRF-Token": csrf}, call))
    report["cancel_no_csrf"] = record(*http(base + "/api/cancel", "POST", bearer, {"request_id": "nothing"}))
    report["dlq_no_csrf"] = record(*http(base + "/api/dlq/main/0-1/delete", "POST", bearer))

    # In the browser: unauthenticated the page says Unauthorized; logged in (a cookie), a POST
    # from the page's own script without the header is refused, with it accepted.
    console.open("/fleet")
    report["browser_no_token"] = console.one("body").text[:200]
    console.login()
    fetch = """
        const [headers, done] = [arguments[0], arguments[arguments.length - 1]];
        fetch('/api/call', {method: 'POST', headers: Object.assign({'Content-Type': 'application/json'}, headers),
                            body: JSON.stringify({tool: 'echo', arguments: {message: 'from the page'}})})
            .then(r => r.text().then(t => done({status: r.status, body: t})))
            .catch(e => done({status: 0, body: String(e)}));
    """
    report["browser_post_no_csrf"] = console.driver.execute_async_script(fetch, {})
    report["browser_post_with_csrf"] = console.driver.execute_async_script(fetch, {"X-CSRF-Token": console.csrf()})
    report["screenshot_fleet_after_login"] = console.screenshot("fleet-logged-in")
    return report


def main() -> int:
    scenario, base, artifacts, *args = sys.argv[1:]
    # A failure's screenshot from an earlier run would mislead.
    (Path(artifacts) / f"failed-{scenario}.png").unlink(missing_ok=True)
    console = Console(base, Path(artifacts))
    try:
        if scenario == "pages":
            report = pages(console)
        elif scenario == "try-it":
            report = try_it(console, *args)
        elif scenario == "form":
            report = form(console)
        elif scenario == "dlq":
            report = dlq(console, *args)
        elif scenario == "script":
            report = script(console)
        elif scenario == "refusals":
            report = refusals(console)
        elif scenario == "charts":
            report = charts(console, *args)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except Exception:
        # The page as it was, for the artifacts.
        try:
            console.screenshot(f"failed-{scenario}")
        finally:
            console.close()
        raise
    console.close()
    (Path(artifacts) / f"report-{scenario}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
