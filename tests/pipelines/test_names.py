"""What a run is called, coloured and logged as in MLflow: names that lead with what
differs, one colour per configuration, params that apply, a saved default view."""

from __future__ import annotations

import json

import pytest

from pipelines.spec import load_spec
from pipelines.spec.files import inapplicable
from pipelines.tracking import knobs, open_store
from pipelines.tracking.names import (
    COLOR_TAG,
    CONFIG_TAG,
    PALETTE,
    VIEW_KEY,
    config_key,
    experiment_runs,
    experiment_url,
    run_name_for,
    run_tags,
    run_url,
    save_view,
)
from tests.pipelines.conftest import REPO

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
CADENCE = {"trainer.steps": "40", "trainer.batch_size": "64", "orchestrator.eval_every": "5", "task.eval_size": "100"}


def test_names_lead_with_the_knob_that_differs_and_fit_the_table():
    """The issue's three quick starts: every name began `quickstart·steps=40·batch_size=64·
    eval_every=5·…`, so the runs table cut off lr and lag."""
    names = [
        run_name_for("quickstart", {**CADENCE, "trainer.lr": "0.0001"}),
        run_name_for("quickstart", {**CADENCE, "trainer.lr": "0.0003"}),
        run_name_for("quickstart", {**CADENCE, "trainer.lr": "0.0001", "orchestrator.lag": "4"}),
    ]
    assert [n.split("·")[0] for n in names] == ["lr=1e-4", "lr=3e-4", "lr=1e-4"]
    assert names[2].startswith("lr=1e-4·lag=4·")
    assert all(len(n) <= 40 for n in names) and len(set(names)) == 3
    # an algorithm or kind by its value; the seed as ·sN; keys alike in their last part kept apart
    assert run_name_for("s", {"orchestrator.lag": 16, "algorithm.name": "m2po"}, seed=0) == "lag=16·m2po·s0"
    assert run_name_for("s", {"trainer.lr": 1e-3, "model.warm_start.lr": 3e-3}) == "trainer.lr=1e-3·warm_start.lr=3e-3"
    assert run_name_for("quickstart", {"seed": 2}) == "quickstart·s2"
    many = {f"trainer.k{i}": i for i in range(8)}  # knobs are never dropped, however long
    assert run_name_for("s", {**many, "trainer.steps": 5}, limit=None).endswith("k7=7·steps=5")


def test_one_colour_per_configuration_distinct_across_configurations(store):
    client = open_store(store)
    experiment = client.create_experiment("colours")
    specs = {
        lr: load_spec(QUICKSTART, [f"trainer.lr={lr}", f"seed={seed}"])
        for lr, seed in [("1e-4", 0), ("3e-4", 0), ("1e-3", 0)]
    }
    colours = {}
    for lr, spec in specs.items():
        tags = run_tags(experiment_runs(client, experiment), knobs(spec), {})
        client.create_run(experiment, tags=tags, run_name=f"lr={lr}")
        colours[lr] = tags[COLOR_TAG]
    assert list(colours.values()) == list(PALETTE[:3])  # in order, none shared
    again = load_spec(QUICKSTART, ["trainer.lr=3e-4", "seed=7"])  # another seed of one configuration
    assert config_key(knobs(again)) == config_key(knobs(specs["3e-4"]))
    assert run_tags(experiment_runs(client, experiment), knobs(again), {})[COLOR_TAG] == colours["3e-4"]
    assert client.search_runs([experiment])[0].data.tags[CONFIG_TAG] == config_key(knobs(specs["1e-3"]))


def test_params_are_the_options_that_apply():
    """78 params per run included a decoded reward's timeout on an exact-match reward and
    Ray's resources of a local run."""
    spec = load_spec(QUICKSTART)
    params = knobs(spec)
    for absent in ("rewards.0.timeout_s", "rewards.0.scorer", "runtime.address", "runtime.rollout.num_cpus"):
        assert absent not in params
    assert "buffer.max_staleness" not in params and params["orchestrator.lag"] == "1"  # lagged, not async
    assert "task.path" not in params and "model.path" not in params and params["task.digits"] == "2"
    assert not any(v in ("null", "[]") for v in params.values())
    ray = knobs(load_spec(QUICKSTART, ["runtime.kind=ray", "orchestrator.mode=async"]))
    assert ray["runtime.rollout.num_cpus"] == "0.5" and ray["buffer.max_staleness"] == "1"
    assert "orchestrator.lag" not in ray
    assert "model.warm_start" in inapplicable(
        load_spec(
            QUICKSTART, ["model.kind=pretrained", f"model.path={REPO / 'asyncrlhf' / 'checkpoints' / 'tiny-addition'}"]
        )
    )


@pytest.mark.parametrize("objective, maximize", [("eval/accuracy", True), ("loss/policy", False)])
def test_the_saved_view_shows_the_objective_and_the_changed_knobs(store, objective, maximize):
    client = open_store(store)
    experiment = client.create_experiment("view")
    client.create_run(
        experiment,
        tags={"asyncrlhf.changed": json.dumps(["trainer.steps", "trainer.lr", "seed", "runtime.torch_threads"])},
    )
    client.create_run(experiment, tags={"sweep.params": json.dumps({"orchestrator.lag": 2})})
    save_view(client, experiment, objective, maximize)
    state = json.loads(client.get_experiment(experiment).tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
    assert state["orderByKey"] == f"metrics.`{objective}`" and state["orderByAsc"] is (not maximize)
    metrics = list(dict.fromkeys([objective, "eval/accuracy", "reward/mean"]))
    params = ["trainer.lr", "orchestrator.lag", "trainer.steps"]  # how long last; runtime.* left out
    assert state["selectedColumns"] == [*(f"metrics.`{m}`" for m in metrics), *(f"params.`{p}`" for p in params)]


def test_links_open_the_model_training_layout():
    assert experiment_url("http://h:5000/", "3", VIEW_KEY) == (
        "http://h:5000/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=asyncrlhf"
    )
    assert (
        run_url("http://h:5000", "3", "abc") == "http://h:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
