#!/usr/bin/env bash
# Issue 29's table, re-run as a user would, in a fresh folder of a fresh clone.
# Usage: bash scripts/reliability_probes.sh "$PWD"   (after bash scripts/setup.sh; about 15 min on 2 cores)
# Each line says HELD or BROKE; probes 6 (disk full, a tmpfs) needs root, else it says SKIP.
set -u
CLONE=$1; A="$CLONE/.venv/bin/asyncrlhf"; PY="$CLONE/.venv/bin/python"
W=$(mktemp -d /tmp/probes.XXXX); cd "$W"; echo "work folder $W"
Q="$CLONE/experiments/quickstart.yaml --set trainer.steps=60 --set trainer.checkpoint_every=10 --set orchestrator.eval_every=10 --set tracking.flush_every=7"
ok() { echo "HELD  $*"; }; bad() { echo "BROKE $*"; }
rid() { ls -t mlflow/checkpoints | head -1; }
steps_once() {  # run id, expected count: loss/policy rows are steps 1..N once each
  $PY - "$1" "$2" <<'PY'
import sys
from mlflow import MlflowClient
h = sorted(m.step for m in MlflowClient("sqlite:///mlflow/mlflow.db").get_metric_history(sys.argv[1], "loss/policy"))
print("ok" if h == list(range(1, int(sys.argv[2]) + 1)) else f"rows {len(h)} distinct {len(set(h))} max {max(h, default=0)}")
PY
}
status() { $PY -c "from mlflow import MlflowClient; print(MlflowClient('sqlite:///mlflow/mlflow.db').get_run('$1').info.status)"; }

echo "== 1. resume of a run still training"
$A run $Q --set trainer.steps=150 > r1.txt 2>&1 & P=$!
until ls mlflow/checkpoints/*/step-000020 >/dev/null 2>&1; do sleep 0.2; done
R=$(rid); $A resume $R > r1b.txt 2>&1; c=$?
kill -TERM $P; wait $P
[ $c = 2 ] && grep -q "still training" r1b.txt && ok "1: refused (exit 2)" || bad "1: exit $c $(tail -1 r1b.txt)"
$A resume $R --set trainer.steps=150 > /dev/null 2>&1; s=$(steps_once $R 150); [ "$s" = ok ] && ok "1: after resume 150 steps once each" || bad "1: $s"

echo "== 2. resume trusts an edited spec.yaml"
$A run $Q > r2.txt 2>&1; R=$(rid)
sed -i 's/^  lr: .*/  lr: 0.5/' mlflow/artifacts/*/$R/artifacts/spec.yaml 2>/dev/null || sed -i 's/^  lr: .*/  lr: 0.5/' $(find mlflow/artifacts -path "*$R/artifacts/spec.yaml")
$A resume $R --set trainer.steps=70 > r2b.txt 2>&1; c=$?
[ $c = 2 ] && grep -q "trainer.lr" r2b.txt && ok "2: edited spec refused, naming trainer.lr" || bad "2: exit $c $(tail -1 r2b.txt)"
echo "trainer: {lr: [" > $(find mlflow/artifacts -path "*$R/artifacts/spec.yaml"); $A resume $R --set trainer.steps=70 > r2c.txt 2>&1; c=$?
[ $c = 2 ] && [ $(grep -c . r2c.txt) -le 2 ] && ! grep -q Traceback r2c.txt && ok "2: garbled spec one line" || bad "2: garbled exit $c"
R2=$R

echo "== 3. export destroys user data"
mkdir -p t/policy; echo notes > t/policy/notes.txt
$A export $R2 --out t/my-policy > /dev/null 2>&1
[ -f t/policy/notes.txt ] && [ -f t/my-policy/config.json ] && [ ! -f t/my-policy/notes.txt ] && ok "3: t/policy untouched" || bad "3: $(ls -R t)"
$A run $Q --set trainer.steps=20 > /dev/null 2>&1; RB=$(rid)
$A export $R2 --out policy > /dev/null 2>&1; $A export $RB --out policy-b > /dev/null 2>&1
[ -f policy/config.json ] && [ -f policy-b/config.json ] && ok "3: ./policy kept beside policy-b" || bad "3: $(ls)"
$A export $RB --out policy > e3.txt 2>&1; c=$?; [ $c = 2 ] && ok "3: non-empty target refused" || bad "3: overwrite exit $c"

echo "== 4. SIGTERM at start-up"
held=0; tries=6
for i in $(seq $tries); do
  rm -rf s4; mkdir s4; (cd s4; $A run $CLONE/experiments/quickstart.yaml --set trainer.steps=40 > o.txt 2>&1 & P=$!; sleep 5.$i; kill -TERM $P; wait $P; echo $? > rc)
  c=$(cat s4/rc); st=$(cd s4; [ -d mlflow/checkpoints ] && [ "$(ls mlflow/checkpoints)" ] && status $(ls mlflow/checkpoints | head -1) || echo none)
  if [ $c = 143 ] && [ "$st" != FINISHED ]; then held=$((held+1)); else echo "   try $i: exit $c status $st"; fi
done
[ $held = $tries ] && ok "4: $held/$tries stopped (exit 143, never FINISHED)" || bad "4: $held/$tries"

echo "== 5. stop during the final upload"
cat > kill.py <<'PY'
import os, signal, sys
import pipelines.run.experiment as run
from pipelines.spec import load_spec
run._log_policy = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
run.run_experiment(load_spec(sys.argv[1], sys.argv[2:]))
PY
$PY kill.py $CLONE/experiments/quickstart.yaml trainer.steps=60 trainer.checkpoint_every=10 orchestrator.eval_every=10 tracking.flush_every=7 > /dev/null 2>&1
R=$(rid); $A resume $R > r5.txt 2>&1; c=$?
s=$(steps_once $R 60); st=$(status $R)
[ $c = 0 ] && [ "$s" = ok ] && [ "$st" = FINISHED ] && ok "5: resume finished it, 60 steps once" || bad "5: exit $c $s $st $(tail -1 r5.txt)"
$A resume $R --set trainer.steps=80 > /dev/null 2>&1
$PY - $R <<'PY' && ok "5: continued run: each whole-run figure once per step" || bad "5: figures twice"
import sys
from mlflow import MlflowClient
c = MlflowClient("sqlite:///mlflow/mlflow.db")
for key in ("time/total_s", "perf/bubble_frac_trainer", "perf/checkpoint_frac"):
    steps = [m.step for m in c.get_metric_history(sys.argv[1], key)]
    assert len(steps) == len(set(steps)), (key, steps)
PY

echo "== 6. the store"
cp mlflow/mlflow.db good.db
: > mlflow/mlflow.db; $A resume $R2 > r6.txt 2>&1; c=$?; [ $c = 2 ] && grep -q "is empty (0 bytes)" r6.txt && ok "6: 0-byte mlflow.db refused" || bad "6: empty exit $c"
cp good.db mlflow/mlflow.db; truncate -s $(( $(stat -c %s good.db) / 2 )) mlflow/mlflow.db; $A resume $R2 > r6.txt 2>&1; c=$?
[ $c = 2 ] && grep -q "is truncated" r6.txt && [ $(grep -c . r6.txt) = 1 ] && ok "6: truncated mlflow.db one line" || bad "6: truncated exit $c"
cp good.db mlflow/mlflow.db
cat > sw.yaml <<YML
name: probe_sweep
base: $CLONE/experiments/quickstart.yaml
overrides: [trainer.steps=4, trainer.batch_size=32, orchestrator.eval_every=2, task.eval_size=20]
method: grid
parallel: 2
space: {orchestrator.lag: [0, 1]}
YML
$A sweep sw.yaml > s6.txt 2>&1
cp mlflow/optuna.db optuna.good; head -c 20000 optuna.good > mlflow/optuna.db; $A sweep sw.yaml > s6b.txt 2>&1; c=$?
[ $c = 2 ] && [ $(grep -vc "WARNING\|^$" s6b.txt) -le 2 ] && grep -q "optuna.db" s6b.txt && ok "6: damaged optuna.db one line" || bad "6: damaged optuna exit $c $(wc -l < s6b.txt) lines"
rm mlflow/optuna.db; $A sweep sw.yaml > s6c.txt 2>&1; c=$?
[ $c = 2 ] && grep -q "has no study in" s6c.txt && ok "6: deleted optuna.db refused" || bad "6: deleted optuna exit $c"
cp optuna.good mlflow/optuna.db
if mkdir -p full && mount -t tmpfs -o size=12m tmpfs full 2>/dev/null; then
  (cd full; $A run $CLONE/experiments/quickstart.yaml --set trainer.steps=4 --set trainer.checkpoint_every=2 > o.txt 2>&1; echo $? > rc)
  RF=$(ls full/mlflow/checkpoints | head -1); st=$(cd full; status $RF)
  tmp=$(find full/mlflow/checkpoints -name ".step-*" | wc -l)
  [ $(cat full/rc) = 1 ] && grep -q "No space left on device" full/o.txt && [ $st = FAILED ] && [ $tmp = 0 ] && ok "6: disk full: FAILED with ENOSPC, no partial checkpoint" || bad "6: disk full rc $(cat full/rc) $st tmp $tmp"
  umount full
else echo "SKIP  6: disk full (no tmpfs mount here)"; fi
mkdir -p mlflow/checkpoints/$RB/.step-000030.tmp-99999; $A resume $RB --set trainer.steps=30 > /dev/null 2>&1
[ ! -e mlflow/checkpoints/$RB/.step-000030.tmp-99999 ] && ok "6: killed write's .tmp folder removed" || bad "6: .tmp stays"

echo "== 7. inputs that validate, then fail"
for o in "orchestrator.timeout_s=1e308" "tracking.experiment=$(printf 'x%.0s' $(seq 5000))" "rollout.group_size=1" "rollout.workers=100000"; do
  $A run $CLONE/experiments/quickstart.yaml --set "$o" > o7.txt 2>&1; c=$?
  [ $c = 2 ] && [ $(grep -c . o7.txt) = 1 ] && ok "7: ${o:0:40} refused in one line" || bad "7: ${o:0:40} exit $c"
done
$PY -c "
import json
good=[json.dumps({'prompt': f'{i}+1=', 'answer': str(i+1)}) for i in range(40)]
open('huge.jsonl','w').write('\n'.join([json.dumps({'prompt':'1'*200000,'answer':'2'}),*good]))"
/usr/bin/time -f %M $A run $CLONE/experiments/quickstart.yaml --set task.kind=jsonl --set task.path=huge.jsonl --set trainer.steps=3 > o7.txt 2> t7.txt; c=$?
[ $c = 0 ] && grep -q "dropped 1 of 41" t7.txt && ok "7: 200k-char prompt dropped, counted (max RSS $(tail -1 t7.txt) kB)" || bad "7: huge prompt exit $c"
sed 's/name: probe_sweep/name: a\/b/' sw.yaml > slash.yaml; $A sweep slash.yaml > o7.txt 2>&1; c=$?
[ $c = 2 ] && ok "7: sweep name with / refused" || bad "7: slash exit $c"

echo "== 8. rewards"
cat > nanscore.py <<'PY'
import math
def score(response, reference):
    return math.nan if response.startswith("1") else (math.inf if response.startswith("2") else 1e308 if response.startswith("3") else 0.0)
PY
PYTHONPATH=$W $A run $CLONE/experiments/quickstart.yaml --set trainer.steps=4 --set "rewards=[{kind: decoded, scorer: 'nanscore:score'}]" > o8.txt 2>&1; c=$?
[ $c = 0 ] && ok "8: NaN/inf/1e308 scorer: run completes" || bad "8: exit $c $(tail -2 o8.txt)"
$PY - <<'PY' && ok "8: reward/nonfinite counted, no NaN advantage" || bad "8: metrics"
from mlflow import MlflowClient
c = MlflowClient("sqlite:///mlflow/mlflow.db")
runs = c.search_runs([e.experiment_id for e in c.search_experiments()], order_by=["start_time DESC"], max_results=1)
h = c.get_metric_history(runs[0].info.run_id, "reward/nonfinite")
assert h and any(m.value > 0 for m in h), h
PY

echo "== 9. a million-point grid"
cat > big.yaml <<YML
name: big_grid
base: $CLONE/experiments/quickstart.yaml
overrides: [trainer.steps=2, trainer.batch_size=16, orchestrator.eval_every=1, task.eval_size=8, orchestrator.mode=lagged, orchestrator.lag=0]
method: grid
parallel: 1
space: {trainer.lr: [1.0e-5, 2.0e-5, 3.0e-5, 4.0e-5, 5.0e-5, 6.0e-5, 7.0e-5, 8.0e-5, 9.0e-5, 1.0e-4], seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], rollout.temperature: [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4], orchestrator.lag: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], task.eval_seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], trainer.warmup_updates: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}
YML
start=$(date +%s); timeout 300 $A sweep big.yaml --max-trials 1 > o9.txt 2>&1; c=$?; took=$(( $(date +%s) - start ))
[ $c = 0 ] && grep -q "trial   0" o9.txt && ok "9: 10^6-point grid ran its first trial in ${took}s" || bad "9: exit $c after ${took}s"

echo "== 11. ui"
$A ui --port 5077 > u.txt 2>&1 & P=$!; sleep 8; kill -HUP $P; wait $P; sleep 3
n=$(ps -eo cmd | grep -c "[p]ort 5077\|[1]27.0.0.1:5077"); [ "$n" = 0 ] && ok "11: SIGHUP ends the server" || bad "11: $n server processes left"
$PY -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',5078)); s.listen(); time.sleep(20)" & B=$!; sleep 1
$A ui --port 5078 > u2.txt 2>&1; c=$?; kill $B
[ $c = 2 ] && ok "11: busy port exit 2" || bad "11: busy port exit $c"

echo "== 12. Ray run SIGKILL (the resumed parent's error tag: test_a_reopened_parent_run_drops_the_error_of_its_last_stop)"
$A run $CLONE/experiments/ray_async.yaml --set trainer.steps=2000 > o12.txt 2>&1 & P=$!
sleep 40; kill -9 $P; wait $P 2>/dev/null; sleep 3
n=$(ps -eo stat,cmd | grep -E "ray::|raylet|gcs_server" | grep -v "^Z" | grep -vc grep)
[ "$n" = 0 ] && ok "12: no Ray process 3 s after SIGKILL" || bad "12: $n Ray processes alive"
echo "done: $W"
