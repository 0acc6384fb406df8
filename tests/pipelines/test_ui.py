from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

from mlflow import MlflowClient

from tests.pipelines.conftest import cli, env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_ui_serves_the_store_on_localhost(store):
    client = MlflowClient(store)
    experiment = client.create_experiment("ui-check")
    run = client.create_run(experiment, run_name="seen-through-http")
    client.log_metric(run.info.run_id, "reward/mean", 0.5, step=1)
    client.set_terminated(run.info.run_id)

    port = free_port()
    server = subprocess.Popen(
        [*cli(), "ui", "--port", str(port), "--uri", store],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                experiments = get_json(f"{base}/experiments/search?max_results=100")
                break
            except OSError:
                assert server.poll() is None, "the UI server exited early"
                assert time.monotonic() < deadline, "the UI server did not answer within 90 s"
                time.sleep(0.5)
        ids = [e["experiment_id"] for e in experiments["experiments"] if e["name"] == "ui-check"]
        found = get_json(f"{base}/runs/search", {"experiment_ids": ids})["runs"]
        assert [r["info"]["run_name"] for r in found] == ["seen-through-http"]
        assert found[0]["data"]["metrics"][0]["key"] == "reward/mean"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
