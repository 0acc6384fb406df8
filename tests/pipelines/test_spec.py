from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipelines.spec import ExperimentSpec, SpecError, load_spec, spec_from_dict
from pipelines.spec.files import flatten, spec_hash
from pipelines.spec.memory import estimate_bytes
from pipelines.sweeps import load_sweep

SHIPPED = sorted(Path(__file__).resolve().parents[2].joinpath("experiments").glob("*.yaml"))
SWEEPS = [p for p in SHIPPED if "space" in yaml.safe_load(p.read_text())]
EXPERIMENTS = [p for p in SHIPPED if p not in SWEEPS]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_shipped_experiment_validates_and_names_its_command(path, request):
    # word_problems.yaml runs on a model directory `asyncrlhf chat-model` builds: one of 5 steps here
    built = ["model.path=" + str(request.getfixturevalue("chat_model_dir"))] if path.stem == "word_problems" else []
    spec = load_spec(path, built)
    assert spec.trainer.batch_size % spec.rollout.group_size == 0
    first = path.read_text().splitlines()[0]
    assert first.startswith("# asyncrlhf run experiments/") and path.name in first


def load_shipped_sweep(path: Path, request) -> tuple:  # type: ignore[no-untyped-def]
    """A shipped sweep; one over word_problems.yaml on the model `asyncrlhf chat-model` builds."""
    if yaml.safe_load(path.read_text())["base"] != "word_problems.yaml":
        return load_sweep(path)
    overrides = [
        *yaml.safe_load(path.read_text()).get("overrides", []),
        "model.path=" + str(request.getfixturevalue("chat_model_dir")),
    ]
    return load_sweep(path, ["overrides=" + json.dumps(overrides)])


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_shipped_sweep_validates_and_names_its_command(path, request):
    sweep, base = load_shipped_sweep(path, request)
    assert sweep.parallel == 2 and sweep.num_trials * len(sweep.seeds or [None]) >= 4  # runs
    assert spec_from_dict(base).runtime.kind == "local"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# asyncrlhf sweep experiments/") and path.name in first


def test_the_shipped_sweeps_cover_staleness_thresholds_group_sizes_and_tuning(request):
    spaces = {p.stem: load_shipped_sweep(p, request)[0] for p in SWEEPS}
    staleness = spaces["staleness_sweep"]
    assert staleness.space == {"orchestrator.lag": [0, 4, 16, 64], "algorithm.name": ["grpo", "m2po"]}
    assert staleness.seeds == [0, 1, 2]  # a learning result is a mean over seeds
    assert "algorithm.m2_threshold" in spaces["m2po_threshold_sweep"].space
    assert "rollout.group_size" in spaces["group_size_sweep"].space
    tune = spaces["optuna_tune"]
    assert tune.method == "optuna" and tune.prunes
    assert {"trainer.lr", "algorithm.clip_eps", "algorithm.m2_threshold", "rollout.group_size"} <= set(tune.space)


def test_the_quickstart_overlaps_rollout_and_training_one_version_stale():
    quickstart = EXPERIMENTS[[p.name for p in EXPERIMENTS].index("quickstart.yaml")]
    spec = load_spec(quickstart)
    # lagged k = 1: rollout of the next batch overlaps training on this one, every batch one version stale
    assert (spec.orchestrator.mode, spec.orchestrator.lag, spec.model.kind, spec.rollout.engine) == (
        "lagged",
        1,
        "tiny",
        "hf",
    )
    assert spec.trainer.warmup == 64 and spec.trainer.lr_decay == "cosine"
    short = load_spec(quickstart, ["trainer.steps=4"])
    assert short.trainer.warmup == 0  # the warm-up is a share of the run: a short run keeps a valid schedule
    given = load_spec(quickstart, ["trainer.warmup_updates=10"])
    assert given.trainer.to_optim().warmup_updates == 10  # a count takes precedence over the share
    assert spec.trainer.to_optim().micro_batch_size is None
    micro = load_spec(quickstart, ["trainer.micro_batch_size=64"])
    assert micro.trainer.to_optim().micro_batch_size == 64
    assert estimate_bytes(micro)["batch"] < estimate_bytes(spec)["batch"]  # one micro-batch's activations


def test_the_studies_base_is_async_under_a_staleness_bound_with_a_constant_lr():
    """The shipped sweeps' figures were measured on addition.yaml; the quick start is tuned apart."""
    spec = load_spec(EXPERIMENTS[[p.name for p in EXPERIMENTS].index("addition.yaml")])
    assert (spec.orchestrator.mode, spec.buffer.max_staleness, spec.trainer.lr, spec.trainer.lr_decay) == (
        "async",
        1,
        3e-4,
        "constant",
    )
    bases = {p.stem: yaml.safe_load(p.read_text())["base"] for p in SWEEPS}
    assert {base for name, base in bases.items() if not name.startswith("word_problems")} == {"addition.yaml"}


# "Billion laughs": 9 levels of 9 aliases each, 9^9 strings once expanded.
ALIAS_BOMB = 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

BAD = [
    ("bogus: 1\n", ["bogus", "unknown key", "1"]),
    ("trainer:\n  lr: fast\n", ["trainer.lr", "'fast'"]),
    ("buffer:\n  max_staleness: -1\n", ["buffer.max_staleness", "-1"]),
    ("rollout:\n  group_size: 0\n", ["rollout.group_size", "0"]),
    ("trainer:\n  batch_size: 10\n", ["trainer.batch_size=10", "rollout.group_size=8"]),
    ("model:\n  kind: pretrained\n  path: /no/such/model\n", ["model", "/no/such/model"]),
    ("name: [unclosed\n", ["malformed YAML"]),
    ("rewards:\n  - kind: no_such_reward\n", ["rewards.0.kind", "no_such_reward"]),
    ("orchestrator:\n  mode: lagged\n", ["orchestrator.lag"]),
    ("orchestrator:\n  mode: async\n  publish_every: 5\n", ["orchestrator.publish_every=5"]),
    ("- just\n- a list\n", ["mapping"]),
    ("rollout:\n  workers: 2\n", ["rollout.workers=2", "runtime.kind 'ray'"]),
    ("runtime:\n  address: auto\n", ["runtime", "address 'auto'", "kind 'ray'"]),
    (
        "rollout:\n  workers: 2\nruntime:\n  kind: ray\n  trainer:\n    num_cpus: 1.5\n",
        ["runtime.trainer.num_cpus=1.5", "2.5", "runtime.num_cpus=2"],
    ),
    ("runtime:\n  kind: cluster\n", ["runtime.kind", "'cluster'"]),
    ("trainer:\n  steps: 10\n  warmup_updates: 10\n  lr_decay: cosine\n", ["trainer.warmup_updates=10", "makes 10"]),
    ("trainer:\n  warmup_ratio: 1.0\n", ["trainer.warmup_ratio", "1.0"]),
    ("trainer:\n  lr_decay: step\n", ["trainer.lr_decay", "'step'"]),
    # untrainable or malicious input
    ("trainer:\n  lr: .inf\n", ["trainer.lr", "finite", "inf"]),
    ("rollout:\n  temperature: .inf\n", ["rollout.temperature", "finite"]),
    ("algorithm:\n  kl_coef: .inf\n", ["algorithm.kl_coef", "finite"]),
    ("rewards:\n  - kind: exact_match\n    weight: .nan\n", ["rewards.0.weight", "finite"]),
    ("", ["the spec file is empty"]),
    ("# only a comment\n", ["the spec file is empty"]),
    ("trainer:\n  lr: 1.0e-4\ntrainer:\n  lr: 1.0\n", ["duplicate key 'trainer' (line 3)"]),
    ("trainer:\n  lr: 1.0e-4\n  lr: 1.0\n", ["duplicate key 'lr' (line 3)"]),
    (ALIAS_BOMB, ["more than 100000 nodes", "alias bomb"]),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e[0] for e in BAD])
def test_bad_specs_fail_with_one_line_naming_field_and_value(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message


def test_overrides_are_typed_by_the_schema(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\n")
    spec = load_spec(
        path,
        [
            "trainer.lr=1e-4",
            "rollout.group_size=4",
            "orchestrator.mode=lagged",
            "orchestrator.lag=3",
            "tracking.tags={team: rl}",
        ],
    )
    assert spec.trainer.lr == 1e-4 and spec.rollout.group_size == 4
    assert spec.orchestrator.lag == 3 and spec.tracking.tags == {"team": "rl"}
    with pytest.raises(SpecError, match=r"trainer\.steps"):
        load_spec(path, ["trainer.steps=many"])
    with pytest.raises(SpecError, match=r"key\.path=value"):
        load_spec(path, ["trainer.steps"])


def test_a_directory_or_a_binary_file_is_not_a_spec(tmp_path):
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)
    binary = tmp_path / "spec.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(SpecError, match="not UTF-8 text"):
        load_spec(binary)


def test_missing_file():
    with pytest.raises(SpecError, match="does not exist"):
        load_spec("no/such/spec.yaml")


def test_every_field_is_described():
    schema = ExperimentSpec.model_json_schema()

    def undescribed(node: dict, where: str) -> list[str]:
        out = []
        for name, prop in node.get("properties", {}).items():
            if "description" not in prop:
                out.append(f"{where}.{name}")
        return out

    missing = undescribed(schema, "spec")
    for name, definition in schema.get("$defs", {}).items():
        missing += undescribed(definition, name)
    assert missing == []
    json.dumps(schema)


def test_flatten_and_hash_are_stable():
    spec = ExperimentSpec()
    flat = flatten(spec)
    assert flat["trainer.lr"] == "0.0003" and flat["rewards.0.kind"] == "exact_match"
    assert spec_hash(spec) == spec_hash(ExperimentSpec()) != spec_hash(ExperimentSpec(seed=1))


def test_the_old_sync_every_key_still_reads_with_a_warning(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("orchestrator:\n  mode: async\n  sync_every: 2\nbuffer:\n  max_staleness: 1\n")
    with pytest.warns(FutureWarning, match="publish_every"):
        spec = load_spec(path)
    assert spec.orchestrator.publish_every == 2 and spec.to_schedule().publish_every == 2
    with pytest.raises(SpecError, match="give only publish_every"):
        load_spec(path, ["orchestrator.publish_every=1"])


def test_the_algorithm_section_is_one_model_per_algorithm(tmp_path):
    spec = spec_from_dict({"algorithm": {"clip_eps": 0.3}})  # no name: GRPO, the default
    assert spec.algorithm.name == "grpo" and spec.algorithm.loss_options() == {
        "clip_eps": 0.3,
        "clip_eps_high": None,
        "clip_ratio_c": None,
        "kl_coef": 0.0,
        "loss_agg": "token-mean",
    }
    m2po = spec_from_dict({"algorithm": {"name": "m2po", "m2_clip": True}}).algorithm
    assert m2po.loss_options() == {
        "m2_threshold": 0.04,
        "mode": "batch",
        "clip_eps": 0.2,
        "min_clip_low": None,
        "min_clip_high": None,
        "loss_agg": "token-mean",
    }
    with pytest.raises(SpecError, match=r"algorithm.m2_threshold: unknown key for algorithm 'grpo' \(value 0.1\)"):
        spec_from_dict({"algorithm": {"name": "grpo", "m2_threshold": 0.1}})
    with pytest.raises(SpecError, match="'sgd'"):
        spec_from_dict({"algorithm": {"name": "sgd"}})


@pytest.mark.parametrize("reward", ["{kind: exact_match}", "{kind: decoded, workers: 3, timeout_s: 1.5}"])
def test_a_logged_spec_validates_again(reward):
    """A run's spec.yaml holds every field, defaults included; resume validates it again
    (decoded options at their defaults on another kind were once refused there)."""
    spec = load_spec(Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml", [f"rewards=[{reward}]"])
    assert spec_from_dict(json.loads(json.dumps(spec.model_dump(mode="json")))) == spec
