from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipelines.tracking.store import OWNER_TAG
from tests.helpers import free_port, patience
from tests.pipelines.conftest import cli, env


def get_json(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def live_processes() -> dict[int, int]:
    """pid → parent pid of every live (not zombie) process."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> set[int]:
    parents, found, frontier = live_processes(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_ui_serves_the_reconciled_store_on_localhost_and_ends_with_its_workers_on_sigterm(store):
    client = MlflowClient(store)
    experiment = client.create_experiment("ui-check")
    run = client.create_run(experiment, run_name="seen-through-http")
    client.log_metric(run.info.run_id, "reward/mean", 0.5, step=1)
    client.set_terminated(run.info.run_id)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    owner = json.dumps({"host": socket.gethostname(), "pid": gone.pid, "started": None})
    orphan = client.create_run(experiment, run_name="sigkilled", tags={OWNER_TAG: owner}).info.run_id

    port = free_port()
    out = (Path(store.removeprefix("sqlite:///")).parent / "ui.out").open("w+")
    ui = subprocess.Popen(
        [*cli(), "ui", "--port", str(port), "--uri", store],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env(),
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                experiments = get_json(f"{base}/experiments/search?max_results=100")
                break
            except OSError:
                assert ui.poll() is None, "the UI server exited early"
                assert time.monotonic() < deadline, "the UI server did not answer within 90 s"
                time.sleep(0.5)
        ids = [e["experiment_id"] for e in experiments["experiments"] if e["name"] == "ui-check"]
        found = {r["info"]["run_name"]: r for r in get_json(f"{base}/runs/search", {"experiment_ids": ids})["runs"]}
        assert set(found) == {"seen-through-http", "sigkilled"}
        assert found["seen-through-http"]["data"]["metrics"][0]["key"] == "reward/mean"
        assert found["sigkilled"]["info"]["status"] == "KILLED"  # its process was gone: marked before serving
        assert client.get_run(orphan).info.status == "KILLED"
        # Tagged for model training (MLflow 3 then opens it on its runs), and the runs URL printed.
        assert client.get_experiment(experiment).tags["mlflow.experimentKind"] == "custom_model_development"
        out.seek(0)
        printed = out.read()
        site, mode = f"http://127.0.0.1:{port}/#/experiments", "workflowType=machine_learning"
        assert f"ui-check: {site}/{experiment}/runs?{mode}" in printed  # the runs, in the Model-training layout
        server = descendants(ui.pid)  # the MLflow server and its workers
        assert server
        ui.send_signal(signal.SIGTERM)  # to `asyncrlhf ui` alone, as `timeout` or `docker stop` would
        assert ui.wait(timeout=30) == 143
        with pytest.raises(OSError):
            get_json(f"{base}/experiments/search?max_results=1")
        assert not server & set(live_processes())  # none left behind, still listening
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()


@pytest.mark.nightly  # CI: SIGTERM ends the server (the test above)
def test_ui_ends_its_server_on_sighup_too(store):
    """SIGHUP (the terminal closed) ended `asyncrlhf ui` and left its 15 server processes
    listening; every ending signal now ends the server's whole process group."""
    port = free_port()
    ui = subprocess.Popen(
        [*cli(), "ui", "--port", str(port), "--uri", store],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env=env(),
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + patience(90)
        while True:
            try:
                get_json(f"{base}/experiments/search?max_results=1")
                break
            except OSError:
                assert ui.poll() is None and time.monotonic() < deadline, "the UI server did not come up"
                time.sleep(0.5)
        server = descendants(ui.pid)
        ui.send_signal(signal.SIGHUP)
        assert ui.wait(timeout=patience(30)) == 128 + signal.SIGHUP
        with pytest.raises(OSError):
            get_json(f"{base}/experiments/search?max_results=1")
        assert server and not server & set(live_processes())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGKILL)


def test_ui_on_a_busy_port_says_so_and_exits_2(store):
    """It printed its links and exited 0, leaving the user on someone else's server."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*cli(), "ui", "--port", str(port), "--uri", store],
            capture_output=True,
            text=True,
            env=env(),
            timeout=patience(60),
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--port {port} on 127.0.0.1 is in use" in done.stderr and "http://" not in done.stdout
