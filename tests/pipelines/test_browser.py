"""What a user sees in the MLflow UI, in a real browser: Playwright driving the system
Chromium (headless), on the UI that ``asyncrlhf ui`` serves over a store holding a
finished run and a finished sweep. Skips, saying why, where Chromium or Playwright is
missing; ``.ci/run`` installs Chromium. Screenshots are kept in ``$BROWSER_SHOTS``
(default ``.test-artifacts/browser/``, git-ignored)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pipelines.sweeps import load_sweep, run_sweep
from pipelines.tracking import open_store
from pipelines.tracking.names import run_url
from tests.helpers import free_port
from tests.pipelines.conftest import REPO, cli, env

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
LRS = ("1e-4", "3e-4", "1e-3")
FITS = "e => [e, e.closest('[role=gridcell]')].every(x => x.scrollWidth <= x.clientWidth)"  # no text cut off
# BROWSER_SHOTS=docs/screenshots refreshes the docs site's screenshots.
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


def runs_in_the_store(tmp_path: Path) -> Path:
    """Three quick starts that differ only in lr (through the CLI, as a user names them),
    a seeded lag sweep on Ray, and two benchmark runs, the second regressed against a
    baseline it cannot meet."""
    from typer.testing import CliRunner

    from pipelines.bench.gate import packaged_baseline
    from pipelines.cli import app

    runner = CliRunner()
    for lr in LRS:
        sets = [arg for option in [*TINY, f"trainer.lr={lr}"] for arg in ("--set", option)]
        done = runner.invoke(app, ["run", str(QUICKSTART), *sets])
        assert done.exit_code == 0, done.output[-2000:]
    sweep_file = tmp_path / "lagsweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "name": "lagsweep",
                "base": str(QUICKSTART),
                "method": "grid",
                "parallel": 2,
                "seeds": [0, 1],
                "overrides": [*TINY, "orchestrator.mode=lagged", "orchestrator.lag=0"],
                "space": {"orchestrator.lag": [0, 2]},
            }
        )
    )
    assert run_sweep(*load_sweep(sweep_file), poll_s=0.2).complete
    # Baselines no loaded machine misses (medians 10× worse), then one no machine meets.
    for name, factor, code in (("lenient", 10.0, 0), ("strict", 0.1, 1)):
        baseline = json.loads(packaged_baseline().read_text())
        for figure in baseline["suites"]["quick"]["figures"].values():
            figure["median"] *= factor if figure["better"] == "lower" else 1 / factor
        (tmp_path / f"{name}.json").write_text(json.dumps(baseline))
        args = ["bench", "--suite", "quick", "--case", "losses", "--baseline", str(tmp_path / f"{name}.json")]
        done = runner.invoke(app, [*args, "--report", str(tmp_path / f"bench-{name}.json")])
        assert done.exit_code == code, done.output[-2000:]
    return sweep_file


@pytest.mark.usefixtures("ray_cluster")
def test_the_ui_shows_runs_you_can_tell_apart_a_sweeps_results_and_the_bench_trend(store, tmp_path):
    runs_in_the_store(tmp_path)
    client = open_store(store)
    ui, urls = serve(store, tmp_path)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        assert set(urls) == {"quickstart", "sweeps", "benchmarks"}, urls
        assert all("viewStateShareKey=asyncrlhf" in urls[e] for e in ("quickstart", "sweeps")), urls
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(30_000)
            names = check_runs_table(page, urls["quickstart"])
            check_eval_table_and_compare(page, names)
            check_run_page(page, client, store)
            check_sweep_parent(page, client, urls["sweeps"], tmp_path)
            check_bench_trend(page, client, store)
            browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


def close_assistant(page) -> None:  # type: ignore[no-untyped-def]
    if page.get_by_role("button", name="Close").count():  # MLflow's assistant panel
        page.get_by_role("button", name="Close").first.click()


def check_runs_table(page, url: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The printed link opens the runs table (not MLflow 3's GenAI overview) with the saved
    view: each name whole and leading with its lr, a colour each, eval/accuracy a column."""
    page.goto(url)
    names = [f"lr={lr}·steps=6·batch=32·eval_every=3" for lr in LRS]
    for name in names:
        page.get_by_role("gridcell").get_by_role("link", name=name, exact=True).wait_for()
    assert "/runs" in page.url and page.get_by_text("Detect Issues").count() == 0
    close_assistant(page)
    cells = page.get_by_role("gridcell").all_inner_texts()
    colours = {name: colour for colour, name in re.findall(r"(#[0-9a-f]{6})\n(lr=[^\n]+)", "\n".join(cells))}
    assert set(colours) == set(names) and len(set(colours.values())) == 3, colours
    for name in names:  # nothing cut: the link's text fits its cell
        link = page.get_by_role("gridcell").get_by_role("link", name=name, exact=True)
        assert link.evaluate(FITS), name
    assert (
        page.locator("[col-id='metrics.`eval/accuracy`']").count() and page.get_by_text("Sort: eval/accuracy").count()
    )
    page.screenshot(path=SHOTS / "runs-table.png")
    return names


def check_eval_table_and_compare(page, names: list[str]) -> None:  # type: ignore[no-untyped-def]
    """The evaluation tables side by side (newest evaluation first, the reference in the
    row), then the three runs' compare page."""
    page.locator("input[value='ARTIFACT']").dispatch_event("click")
    page.get_by_text("eval/samples.json").first.wait_for()
    first = page.get_by_text(re.compile(r"^step \d+: \d+\+\d+= \(answer \d+\)$")).first
    first.wait_for()
    assert first.inner_text().startswith("step 6:")  # the newest evaluation on top, no filter needed
    page.screenshot(path=SHOTS / "eval-table.png")
    page.locator("input[value='TABLE']").dispatch_event("click")
    for name in names:
        row = page.get_by_role("row").filter(has=page.get_by_role("link", name=name, exact=True))
        row.get_by_role("checkbox").first.check()
    page.get_by_role("button", name="Compare").first.click()
    page.get_by_text("Parameters", exact=True).first.wait_for()
    page.goto(page.url + "&workflowType=machine_learning")  # MLflow's compare link drops the layout
    for name in names:
        page.get_by_text(name, exact=True).first.wait_for()
    # The parallel-coordinates plot's default axes: the changed knob against the accuracy
    # (it took the first metric logged, once the constant task/eval_problems).
    found = page.locator(".ant-select-selection-overflow, [class*='select']").all_inner_texts()
    selectors = [text for text in found if text]  # an SVG element has no inner text
    assert any("eval/accuracy" in text for text in selectors), selectors
    assert not any("task/eval_problems" in text for text in selectors), selectors
    page.locator(".js-plotly-plot").first.wait_for()  # the plot drawn, not its placeholder
    page.screenshot(path=SHOTS / "compare.png", full_page=True)


def check_run_page(page, client, store: str) -> None:  # type: ignore[no-untyped-def]
    """A run link opens the Model-training layout: description, charts by prefix, plots."""
    experiment = client.get_experiment_by_name("quickstart").experiment_id
    run = client.search_runs([experiment], order_by=["start_time ASC"])[0]
    page.goto(run_url(page.url.split("/#/")[0], experiment, run.info.run_id))
    page.get_by_text(QUICKSTART_DESCRIPTION).wait_for()
    assert page.get_by_text("Evaluation runs", exact=True).count() == 0  # not the GenAI layout
    page.get_by_role("tab", name="Model metrics").click()
    for section in ("eval", "reward", "staleness", "policy"):  # sections by metric prefix
        page.get_by_text(section, exact=True).first.wait_for()
    page.get_by_text("accuracy", exact=True).first.wait_for()  # the eval/accuracy chart
    page.get_by_text("Step", exact=True).first.wait_for()  # a chart drawn (its x axis), not a spinner
    page.screenshot(path=SHOTS / "run-charts.png")
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("plots", exact=True).first.click()
    page.get_by_text("curves.png", exact=True).first.click()
    page.get_by_text("plots/curves.png", exact=True).wait_for()  # the preview's title
    page.wait_for_function("() => [...document.images].some(i => i.complete && i.naturalWidth >= 600)")
    page.screenshot(path=SHOTS / "run-plot.png")


def check_sweep_parent(page, client, url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The parent's per-configuration means are metrics (columns of the saved view, so
    sortable) equal to trials.csv; its trials are named by their swept values and seed,
    the seeds of a configuration in one colour."""
    experiment = client.get_experiment_by_name("sweeps").experiment_id
    (parent,) = client.search_runs([experiment], "tags.`sweep.method` = 'grid'")
    trials = client.download_artifacts(parent.info.run_id, "summary/trials.csv", str(tmp_path))
    with open(trials) as f:
        rows = {int(r["orchestrator.lag"]): r for r in csv.DictReader(f)}
    for lag in (0, 2):
        mean = parent.data.metrics[f"summary/lag_{lag}/mean"]
        assert (
            mean == pytest.approx(float(rows[lag]["eval/accuracy"]))
            and parent.data.metrics[f"summary/lag_{lag}/n"] == 2
        )
    page.goto(url)
    page.get_by_text("lagsweep", exact=True).first.wait_for()
    for lag in (0, 2):
        page.locator(f"[col-id='metrics.`summary/lag_{lag}/mean`']").first.wait_for()
    for lag in (0, 2):  # sorted by the objective, trials are listed beside their parent
        for seed in (0, 1):
            page.get_by_text(f"lag={lag}·s{seed}", exact=True).first.wait_for()
    page.screenshot(path=SHOTS / "sweep-parent.png")
    # The second link: the trials grouped by configuration (tag sweep.config), one row and
    # one mean ± range band each, named as the trials are.
    grouped = re.search(r"trials by configuration: (http\S+)", (tmp_path / "ui.out").read_text()).group(1)
    page.goto(grouped)
    for lag in (0, 2):
        page.get_by_text(re.compile(rf"lag={lag}(?!·)")).first.wait_for()
    page.screenshot(path=SHOTS / "sweep-grouped.png")


def check_bench_trend(page, client, store: str) -> None:  # type: ignore[no-untyped-def]
    """The newest benchmark run (regressed, FAILED) and its trend.png."""
    experiment = client.get_experiment_by_name("benchmarks").experiment_id
    newest = client.search_runs([experiment], order_by=["start_time DESC"])[0]
    assert newest.info.status == "FAILED" and newest.info.run_name.startswith("quick·")
    page.goto(run_url(page.url.split("/#/")[0], experiment, newest.info.run_id))
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("trend.png", exact=True).first.click()
    page.wait_for_function("() => [...document.images].some(i => i.complete && i.naturalWidth >= 600)")
    page.screenshot(path=SHOTS / "bench-trend.png")
