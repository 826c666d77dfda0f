#!/usr/bin/env bash
# `pip install .` end to end (issue 31): the wheel built from this tree by scikit-build-core,
# installed into a fresh venv beside torch, runs a 2-rank gloo job under the venv's own lifeline-agent
# with no PYTHONPATH. The job checkpoints through lifeline.torch; the venv's `lifeline` lists and
# verifies the checkpoint; lifeline and the ranks' start-up hook come from the venv's site-packages;
# and the agent sees the ranks' steps, which only the hook reports.
#
# Usage: wheel_test.sh [PYTHON [TORCH_PYTHON]]   the interpreter to build with and make the venv from
# (python3), and one of the same Python version whose torch the venv may see (PYTHON).
# The build reuses build-wheel/ in the source tree (pyproject.toml), as `pip install .` does.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${1:-python3}
torch_python=${2:-$python}
steps=4
tmp=$(mktemp -d "${LIFELINE_TEST_TMPDIR:-/var/tmp}/lifeline-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

echo "== building the wheel with $python"
"$python" -m pip wheel "$repo" -w "$tmp/dist" --no-deps
wheel=$(echo "$tmp"/dist/lifeline-*.whl)
[ -f "$wheel" ] || fail "no wheel in $tmp/dist"
version=$(basename "$wheel" | cut -d- -f2)  # CMakeLists.txt's project VERSION

echo "== a fresh venv with $(basename "$wheel") and torch"
"$python" -m venv "$tmp/venv"
venv=$tmp/venv
# TORCH_PYTHON's torch, as a user's environment has its torch before Lifeline is installed
# (installing torch 2.13 again took a minute of this machine's CPU on every run): a .pth puts that
# site-packages after the venv's own, so lifeline and its start-up hook can only come from the venv
# (checked below). Without one of the same Python version, torch is installed here, pinned: the CPU
# build on this machine's disk, never a download of the CUDA one.
version() { "$1" -c 'import sys; print(sys.version_info[:2])'; }
torch_site=""
if [ "$(version "$torch_python" 2>/dev/null)" = "$(version "$python")" ]; then
  torch_site=$("$torch_python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
    2>/dev/null || true)
fi
if [ -n "$torch_site" ]; then
  echo "$torch_site" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_torch.pth"
  "$venv/bin/python" -m pip install "$wheel"
else
  "$venv/bin/python" -m pip install torch==2.13.0 "$wheel"
fi
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "from", torch.__file__)'

unset PYTHONPATH LIFELINE_PYTHONPATH LIFELINE_BIN
export PATH="$venv/bin:$PATH"
cd "$tmp"  # not the source tree: nothing may be imported from it by accident
for program in lifeline lifeline-agent lifeline-sim; do
  [ "$(command -v "$program")" = "$venv/bin/$program" ] || fail "$program is not the venv's: $(command -v "$program")"
  said=$("$program" --version)
  echo "$said"
  [ "$said" = "$program $version" ] || fail "$program --version says '$said', not $version"
done
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

cat > "$tmp/job.py" <<'EOF'
# Each rank says where lifeline and its start-up hook came from; rank 0 asks the agent which steps
# it saw, until both ranks' last step is there: the hook reports steps, the script does not.
import json, os, subprocess, sys, time
import torch, torch.distributed as dist
import lifeline, lifeline.torch

directory, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = lifeline.Checkpointer(directory)
assert lifeline.torch.load(ckpt, model, opt) is None  # a fresh start
lifeline.guard_optimizer(opt, ckpt)
for step in range(1, steps + 1):
    opt.zero_grad()
    model(torch.ones(2, 8)).pow(2).mean().backward()
    opt.step()
ckpt.save(steps, lifeline.torch.state_dict(model, opt)).wait()
ckpt.close()
hook = sys.modules.get("sitecustomize")
print("LIFELINE_FROM", lifeline.__file__)
print("HOOK_FROM", getattr(hook, "__file__", None))
if rank == 0:
    deadline = time.monotonic() + 120
    while True:
        status = subprocess.run(["lifeline-agent", "ctl", os.environ["LIFELINE_CONTROL"], "status"],
                                capture_output=True, text=True, check=True, timeout=60).stdout
        seen = [r["step"] for r in json.loads(status)["ranks"]]
        if all(s is not None and s >= steps - 1 for s in seen) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print("AGENT_STEPS", json.dumps(seen))
dist.barrier()  # rank 1 stays up while rank 0 asks
dist.destroy_process_group()
EOF

echo "== 2 ranks under the venv's lifeline-agent"
rc=0
timeout 900 lifeline-agent run --nproc 2 --master-port 0 --max-restarts 0 --run-dir "$tmp/run" \
  --events-log "$tmp/events.jsonl" -- python "$tmp/job.py" "$tmp/ckpt" "$steps" > "$tmp/agent.out" 2>&1 || rc=$?
cat "$tmp/agent.out"
[ "$rc" = 0 ] || fail "the job exited $rc"
! grep -q "Python ranks are not traced" "$tmp/agent.out" || fail "the agent did not find lifeline_startup/"
grep -q '"action":"finished"' "$tmp/events.jsonl" || fail "no finished event in $(cat "$tmp/events.jsonl")"
for rank in 0 1; do
  grep -qxF "[rank $rank] LIFELINE_FROM $site/lifeline/__init__.py" "$tmp/agent.out" ||
    fail "rank $rank did not import lifeline from $site"
  grep -qxF "[rank $rank] HOOK_FROM $site/lifeline_startup/sitecustomize.py" "$tmp/agent.out" ||
    fail "rank $rank did not run the venv's lifeline_startup/sitecustomize.py"
done
seen=$(sed -n 's/^\[rank 0\] AGENT_STEPS //p' "$tmp/agent.out")
python -c "import json, sys; seen = json.loads(sys.argv[1]); sys.exit(not all(s is not None and s >= $steps - 1 for s in seen))" \
  "${seen:-null}" 2>/dev/null || fail "the agent saw steps ${seen:-none}, not ranks 0 and 1 at step $((steps - 1))"

echo "== the venv's lifeline on the checkpoint"
lifeline ls "$tmp/ckpt"
lifeline ls "$tmp/ckpt" --json | python -c "
import json, sys
sys.exit(not any(c['step'] == $steps and c['state'] == 'complete' for c in json.load(sys.stdin)['checkpoints']))
" || fail "step $steps is not listed complete"
lifeline verify "$tmp/ckpt" || fail "lifeline verify failed"
echo "PASS"
