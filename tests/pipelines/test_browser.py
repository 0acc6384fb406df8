"""What a user sees in the MLflow UI, in a real browser: Playwright driving the system
Chromium (headless), on the UI that ``asyncrlhf ui`` serves over a store holding a
finished run and a finished sweep. Skips, saying why, where Chromium or Playwright is
missing; ``.ci/run`` installs Chromium. Screenshots are kept in ``$BROWSER_SHOTS``
(default ``.test-artifacts/browser/``, git-ignored)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pipelines.run import run_experiment
from pipelines.spec import load_spec
from pipelines.sweeps import load_sweep, run_sweep
from tests.pipelines.conftest import REPO, cli, env
from tests.pipelines.test_ui import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install -y chromium (.ci/run does)")

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
QUICKSTART_DESCRIPTION = yaml.safe_load(QUICKSTART.read_text())["description"]
TINY = [
    "trainer.steps=6",
    "trainer.batch_size=32",
    "orchestrator.eval_every=3",
    "task.eval_size=20",
    "runtime.torch_threads=1",
]
SHOTS = Path(os.environ.get("BROWSER_SHOTS", REPO / ".test-artifacts" / "browser"))


def serve(store: str, folder: Path) -> tuple[subprocess.Popen, dict[str, str]]:  # type: ignore[type-arg]
    """``asyncrlhf ui`` on a free port; its process and the runs URL it printed per experiment."""
    out = (folder / "ui.out").open("w+")
    port = free_port()
    ui = subprocess.Popen(
        [*cli(), "ui", "--port", str(port), "--uri", store],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**env(), "COLUMNS": "400"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while "Application startup complete" not in (text := (folder / "ui.out").read_text()):
        assert ui.poll() is None and time.monotonic() < deadline, text[-2000:]
        time.sleep(0.3)
    urls = dict(re.findall(r"^\s+(\S+): (http://\S+/runs\?workflowType=machine_learning\S*)$", text, re.M))
    return ui, urls


@pytest.mark.usefixtures("ray_cluster")
def test_the_ui_shows_runs_charts_plots_and_a_sweeps_children(store, tmp_path):
    run_experiment(load_spec(QUICKSTART, TINY))
    sweep_file = tmp_path / "lagsweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "name": "lagsweep",
                "base": str(QUICKSTART),
                "method": "grid",
                "parallel": 2,
                "overrides": [*TINY, "orchestrator.mode=lagged", "orchestrator.lag=0"],
                "space": {"orchestrator.lag": [0, 2]},
            }
        )
    )
    assert run_sweep(*load_sweep(sweep_file), poll_s=0.2).complete
    ui, urls = serve(store, tmp_path)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        assert set(urls) == {"quickstart", "sweeps"}, urls
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(30_000)
            # The printed URL opens the runs table (not MLflow 3's GenAI overview).
            page.goto(urls["quickstart"])
            run_name = "quickstart"  # run in-process: no --set to name it by
            run_link = page.get_by_role("gridcell").get_by_role("link", name=run_name, exact=True)
            run_link.wait_for()
            assert "/runs" in page.url and page.get_by_text("Detect Issues").count() == 0
            if page.get_by_role("button", name="Close").count():  # MLflow's assistant panel
                page.get_by_role("button", name="Close").first.click()
            page.screenshot(path=SHOTS / "1-runs-table.png")
            # The evaluation table in the runs page's table-comparison view: one row per
            # (step, problem), each run's output beside it.
            page.locator("input[value='ARTIFACT']").dispatch_event("click")
            page.get_by_text("eval/samples.json").first.wait_for()
            page.get_by_placeholder("Filter by problem").fill("step 6:")  # the last evaluation
            page.get_by_text(re.compile(r"^step 6: \d+\+\d+=$")).first.wait_for()
            page.screenshot(path=SHOTS / "2-eval-table.png")
            page.locator("input[value='TABLE']").dispatch_event("click")
            # The run: its description, its metric charts by section, its plots. A run
            # page opened from the table falls back to the GenAI layout until "Model
            # training" is chosen once (the README says so); the browser remembers it.
            run_link.click()
            page.get_by_text(QUICKSTART_DESCRIPTION).wait_for()
            if page.get_by_text("Evaluation runs", exact=True).count():
                page.get_by_text("Model training", exact=True).first.click(force=True)
                page.goto(urls["quickstart"])
                run_link.click()
                page.get_by_text(QUICKSTART_DESCRIPTION).wait_for()
            assert page.get_by_text("Evaluation runs", exact=True).count() == 0
            page.get_by_role("tab", name="Model metrics").click()
            for section in ("eval", "reward", "staleness", "policy"):  # sections by metric prefix
                page.get_by_text(section, exact=True).first.wait_for()
            page.get_by_text("accuracy", exact=True).first.wait_for()  # the eval/accuracy chart
            page.get_by_text("Step", exact=True).first.wait_for()  # a chart drawn (its x axis), not a spinner
            page.screenshot(path=SHOTS / "3-run-charts.png")
            page.get_by_role("tab", name="Artifacts").click()
            page.get_by_text("plots", exact=True).first.click()
            page.get_by_text("curves.png", exact=True).first.click()
            page.get_by_text("plots/curves.png", exact=True).wait_for()  # the preview's title
            page.wait_for_function("() => [...document.images].some(i => i.complete && i.naturalWidth >= 600)")
            page.screenshot(path=SHOTS / "4-run-plot.png")
            # The sweep: its parent, and its trials under it, named by their swept values.
            page.goto(urls["sweeps"])
            page.get_by_text("lagsweep", exact=True).first.wait_for()
            page.locator("[data-component-id*='runnamecellrenderer']").first.click()
            for lag in (0, 2):
                page.get_by_text(re.compile(rf"^lagsweep-00\d·lag={lag}$")).first.wait_for()
            page.screenshot(path=SHOTS / "5-sweep-children.png")
            browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
