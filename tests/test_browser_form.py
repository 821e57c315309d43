"""Notebook 03's widget form in a real front end: JupyterLab in headless Chromium, driven by Playwright.

nbval proves the kernel side; this proves the widgets render and respond where users use them
(ipywidgets version mismatches break forms silently). It starts JupyterLab on a free localhost
port with a token, on a copy of the repository, opens notebook 03, runs all cells, then sets the
stage to 3, turns on NVMe offload, checks the JSON preview and problem list update, types a bad
file name and sees the error, saves, and checks the file under configs/. Screenshots go to
build/screenshots/. Chromium comes from Debian (no browser download); CI installs it.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: ``KIT_FORM_BROKEN=1``: serve a form whose controls are not wired (this test must then fail), to
#: show that it catches a form that renders but does not respond.
BREAK_ENV = "KIT_FORM_BROKEN"
FORM_WIRING = 'control.observe(self.refresh, names="value")'
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def break_form(root: Path) -> None:
    """Unwire the form's controls in the copy of the kit under ``root``."""
    path = root / "helpers" / "lessons" / "config_builder.py"
    text = path.read_text()
    assert FORM_WIRING in text, "the form's wiring moved: update FORM_WIRING"
    path.write_text(text.replace(FORM_WIRING, "pass  # unwired: " + FORM_WIRING))


def test_the_break_switch_still_finds_the_forms_wiring(tmp_path):
    lessons = tmp_path / "helpers" / "lessons"
    lessons.mkdir(parents=True)
    shutil.copy(ROOT / "helpers" / "lessons" / "config_builder.py", lessons)
    break_form(tmp_path)
    assert "pass  # unwired: " + FORM_WIRING in (lessons / "config_builder.py").read_text()


def _require_browser():
    reason = None
    if CHROMIUM is None:
        reason = "no Chromium on PATH (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "playwright is not installed (pip install playwright; no browser download needed)"
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI must run the browser test: {reason}")
    if reason:
        pytest.skip(reason)


@pytest.fixture
def lab(tmp_path):
    """JupyterLab serving a copy of the repository; yields (url, token, root)."""
    _require_browser()
    from helpers.env import free_port

    root = tmp_path / "kit"
    for name in ("notebooks", "helpers", "configs"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    for name in ("requirements.txt", "requirements-colab.txt"):
        shutil.copy(ROOT / name, root / name)
    if os.environ.get(BREAK_ENV) == "1":
        break_form(root)
    port, token = free_port(18888), secrets.token_hex(16)
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # Render every cell (no windowing), so the form exists in the page wherever it is scrolled.
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = dict(os.environ, KIT_SMOKE="1", TQDM_DISABLE="1", HF_HUB_OFFLINE="1", JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"))
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
                             f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
                             "--LabApp.news_url=", "--LabApp.extension_manager=readonly", "--allow-root"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("JupyterLab exited:\n" + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(1)
        else:
            pytest.fail("JupyterLab did not answer within 120 s:\n" + (tmp_path / "lab.log").read_text()[-3000:])
        yield url, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _select(page, label: str, value: str) -> None:
    """Pick the option whose text starts with ``value`` in the dropdown described by ``label``."""
    select = page.locator(".widget-dropdown", has=page.locator("label", has_text=label)).locator("select")
    texts = [(t or "").strip() for t in select.locator("option").all_text_contents()]
    select.select_option(index=next(i for i, t in enumerate(texts) if t.startswith(value)))


def test_config_form_renders_and_responds(lab):
    from playwright.sync_api import expect, sync_playwright

    url, token, root = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(60_000)
        try:
            page.goto(f"{url}/lab/tree/notebooks/03_config_builder.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            expect(page.get_by_text("| Idle").first).to_be_visible(timeout=120_000)  # the kernel is up
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            # Appears only once the cells have run: the form, then the measured run's check table.
            form = page.locator(".widget-dropdown", has=page.locator("label", has_text="ZeRO stage"))
            expect(form).to_be_visible(timeout=300_000)
            expect(page.get_by_text("the measured run finished").first).to_be_visible(timeout=300_000)
            form.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "form_rendered.png"), full_page=False)

            preview = page.locator(".widget-html pre").filter(has_text='"zero_optimization"').first
            expect(preview).to_contain_text('"stage": 2')
            # the kernel may still be running the cells below the form (Run All): its widget
            # callbacks wait their turn, so allow a busy kernel a minute to answer
            _select(page, "ZeRO stage", "3")
            expect(preview).to_contain_text('"stage": 3', timeout=120_000)
            _select(page, "offload optim.", "nvme")
            _select(page, "offload params", "nvme")
            expect(preview).to_contain_text('"device": "nvme"', timeout=120_000)
            expect(page.get_by_text("NVMe", exact=False).filter(has_text="GiB").first).to_be_visible()
            problems = page.locator(".kit-problems").first
            before = problems.inner_text()
            _select(page, "precision", "bf16")
            expect(problems).to_contain_text("bf16.enabled")
            assert problems.inner_text() != before
            page.screenshot(path=str(SHOTS / "form_stage3_nvme_bf16.png"))
            _select(page, "precision", "fp32")
            expect(problems).not_to_contain_text("bf16.enabled")  # the kernel has answered the change

            name = page.locator(".widget-text", has=page.locator("label", has_text="file name")).locator("input")
            save = page.get_by_role("button", name="save to configs/")
            name.fill("../outside")
            name.press("Enter")
            save.click()
            expect(page.get_by_text("not saved").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "form_bad_name.png"))
            name.fill("browser_test")
            name.press("Enter")
            save.click()
            expect(page.get_by_text("browser_test.json").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "form_saved.png"))
        finally:
            browser.close()
    saved = json.loads((root / "configs" / "browser_test.json").read_text())
    assert saved["zero_optimization"]["stage"] == 3
    assert saved["zero_optimization"]["offload_param"]["device"] == "nvme"
    assert not (root / "outside.json").exists() and not (root / "configs" / ".." / "outside.json").exists()
