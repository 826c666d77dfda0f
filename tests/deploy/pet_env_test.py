#!/usr/bin/env python3
"""lifeline-agent started as Kubernetes starts it forms the right job.

Usage: pet_env_test.py --agent PATH/lifeline-agent [--etcd /usr/bin/etcd] [--keep]

A private etcd on free loopback ports stands for etcd.yaml's Service; each agent stands for one pod,
with only the environment that pod's container gets (the controller's variables, the manifest's
own, PATH, HOME, HOSTNAME) and no rendezvous flag on its command line. The ranks run a tiny
command that writes what the agent gave them (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK,
MASTER_ADDR, MASTER_PORT, ...) to one file per rank. Each pod has an address of its own on
loopback (127.0.0.1, 127.0.0.2: its pod IP) and its own memory-tier directory, as two nodes do.

  pytorchjob-2:2   the variables training-operator v1.9 gives an elastic PyTorchJob's workers
                   (pkg/controller.v1/pytorch/envvar.go, elastic.go; minReplicas/maxReplicas
                   defaulted to the 2 replicas, so PET_NNODES=2:2), written out here
  pytorchjob.yaml  tools/deploy/kubernetes/pytorchjob.yaml's worker pods: the operator's variables
                   derived from its elasticPolicy (PET_NNODES=1:2, elastic), its container's own
                   variables and command (ConfigMap, volumes and downward API resolved here)
  jobset.yaml      tools/deploy/kubernetes/jobset.yaml's pods: PET_NODE_RANK from the completion
                   index; node 1's pod starts first and is still GROUP_RANK 1
  each must give: both agents exit 0; world size 4 with 2 ranks per pod; ranks 0-3 each exactly
  once; GROUP_RANK 0 and 1 (RANK = GROUP_RANK * 2 + LOCAL_RANK); one MASTER_ADDR:MASTER_PORT, that
  of the pod holding rank 0; the events log's "scheduler" record names torchrun's variables read
  c10d             PET_RDZV_BACKEND=c10d (the operator's default backend): exit 2 naming the
                   variable and etcd, within seconds
  flags win        torchrun's flags over the variables, as torchrun's own: PET_NNODES=2 and
                   PET_NPROC_PER_NODE=3 with --nnodes=1 --nproc-per-node=2, one node of 2 ranks, exit
                   0; PET_RDZV_BACKEND=c10d with --rdzv-backend=etcd (and --nnodes=1, the pod's
                   literal PET_NPROC_PER_NODE=2): one node of 2 ranks, exit 0
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import check_manifests  # noqa: E402  (the operator's variables, as the manifest check derives them)

KEYS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "LIFELINE_RESTART", "TORCHELASTIC_RESTART_COUNT", "LIFELINE_JOB"]
AGENT_TIMEOUT = 120


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Etcd:
    """etcd on free loopback ports, data in a temporary directory (as agent/etcd/etcd_test_server.h)."""

    def __init__(self, binary, tmp):
        self.dir = tempfile.mkdtemp(prefix="etcd-", dir=tmp)
        self.proc = None
        for _ in range(4):  # a port taken meanwhile: etcd exits at once, try another pair
            client, peer = free_port(), free_port()
            c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
            log = open(os.path.join(self.dir, "etcd.log"), "a")
            self.proc = subprocess.Popen(
                [binary, "--name", "test", "--data-dir", os.path.join(self.dir, "data"), "--listen-client-urls", c,
                 "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                 "--initial-cluster", "test=" + p], stdout=log, stderr=subprocess.STDOUT)
            log.close()
            self.endpoint = f"127.0.0.1:{client}"
            deadline = time.time() + 20
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                        if b"true" in r.read():
                            return
                except OSError:
                    time.sleep(0.1)
            self.stop()
        raise SystemExit(f"etcd did not start (log: {self.dir}/etcd.log)")

    def keys(self, prefix):
        body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                           "range_end": base64.b64encode(prefix[:-1].encode() + bytes([ord(prefix[-1]) + 1])).decode(),
                           "keys_only": True}).encode()
        req = urllib.request.Request(f"http://{self.endpoint}/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return [base64.b64decode(kv["key"]).decode() for kv in json.load(r).get("kvs", [])]

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rank_command(out_dir):
    """The ranks' command: write what the agent gave, one file per rank, and exit 0."""
    code = ("import json, os; d = {k: os.environ.get(k) for k in %r}; "
            "open(os.path.join(%r, 'rank.%%s.%%d.json' %% (d['RANK'], os.getpid())), 'w').write(json.dumps(d))"
            % (KEYS, out_dir))
    return [sys.executable, "-c", code]


def pod_base_env(pod_name, home):
    """What every container has besides its manifest's variables: the image's PATH, HOME, HOSTNAME."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "HOSTNAME": pod_name}


class Pod:
    def __init__(self, name, index, argv, env, out_dir, events):
        self.name, self.index, self.argv, self.env, self.out_dir, self.events = name, index, argv, env, out_dir, events
        self.proc = None
        self.log = None

    def start(self, tmp):
        self.log = os.path.join(tmp, f"{self.name}.log")
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait(self, deadline):
        try:
            return self.proc.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return "timeout"

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()


# ---------------------------------------------------------------------------------------------
# The pods of each case


def literal_pytorchjob_pods(tmp, etcd, agent):
    """The elastic PyTorchJob's worker variables, as training-operator v1.9 sets them for
    elasticPolicy {rdzvBackend: etcd, rdzvHost, rdzvPort, rdzvId} with nprocPerNode "2" and 2
    Worker replicas (min/maxReplicas defaulted to the replicas), pointed at the private etcd."""
    operator = {
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_RDZV_ENDPOINT": etcd.endpoint,
        "PET_RDZV_BACKEND": "etcd",
        "PET_NNODES": "2:2",
        "PET_RDZV_ID": "pet-env-2-2",
    }
    pods = []
    for i in range(2):
        name = f"pet-env-worker-{i}"
        d = os.path.join(tmp, f"p{i}")  # short: the agent's control socket path must fit 107 bytes
        out = os.path.join(d, "out")
        os.makedirs(out)
        os.makedirs(os.path.join(d, "tier"))
        env = pod_base_env(name, d)
        env.update(operator)
        env["LIFELINE_MEMORY_TIER_DIR"] = os.path.join(d, "tier")
        events = os.path.join(d, "events.jsonl")
        argv = [agent, "run", f"--node-host=127.0.0.{i + 1}", f"--checkpoint-dir={tmp}/ckpt",
                f"--events-log={events}", "--no-python-tracing", "--"] + rank_command(out)
        pods.append(Pod(name, i, argv, env, out, events))
    return pods, operator


def manifest_docs(file):
    with open(os.path.join(ROOT, "tools/deploy/kubernetes", file)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def materialise(template, container, injected, index, pod_name, fieldrefs, tmp, etcd, agent, configmaps):
    """The pod's container as a process here: volumes as directories, downward API resolved,
    $(VAR) expanded, the etcd Service replaced by the private etcd, the ranks' command by the tiny
    one. Returns (argv, env, out_dir, events_log, what was replaced)."""
    spec = template.get("spec") or {}
    d = os.path.join(tmp, f"p{index}")  # short: the agent's control socket path must fit 107 bytes
    os.makedirs(d)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    paths = {}  # mountPath -> local directory
    for m in container.get("volumeMounts") or []:
        v = volumes[m["name"]]
        if "emptyDir" in v:  # one per pod
            local = os.path.join(d, v["name"])
        elif "persistentVolumeClaim" in v:  # shared by the pods
            local = os.path.join(tmp, "pvc")
        elif "configMap" in v:
            local = os.path.join(d, "cm")
            os.makedirs(local, exist_ok=True)
            for key, text in (configmaps[v["configMap"]["name"]].get("data") or {}).items():
                with open(os.path.join(local, key), "w") as f:
                    f.write(text)
        else:
            raise SystemExit(f"{pod_name}: volume {v['name']}: a kind this test cannot stand in for")
        os.makedirs(local, exist_ok=True)
        paths[m["mountPath"].rstrip("/")] = local

    def local_path(value):
        for mp in sorted(paths, key=len, reverse=True):
            if value == mp or value.startswith(mp + "/"):
                return paths[mp] + value[len(mp):]
        return value

    replaced = {}
    env = pod_base_env(pod_name, d)
    env.update({k: v for k, v in injected.items() if v is not None})
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            env[e["name"]] = fieldrefs[e["valueFrom"]["fieldRef"]["fieldPath"]]
    for k in list(env):
        if k in ("PATH", "HOME", "HOSTNAME"):
            continue
        env[k] = local_path(env[k])
    if "PET_RDZV_ENDPOINT" in env:
        replaced["PET_RDZV_ENDPOINT"] = f"{env['PET_RDZV_ENDPOINT']} -> {etcd.endpoint}"
        env["PET_RDZV_ENDPOINT"] = etcd.endpoint

    def expand(a):
        return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)

    argv = [expand(str(a)) for a in (container.get("command") or []) + (container.get("args") or [])]
    sep = argv.index("--")
    out = os.path.join(d, "out")
    os.makedirs(out)
    opts, events = [], None
    for a in argv[2:sep]:
        name, eq, value = a.partition("=")
        if name == "--metrics-addr":  # every pod's own 9464: here, ports of their own
            replaced["--metrics-addr"] = f"{value} -> 127.0.0.1:PORT"
            value = f"127.0.0.1:{free_port()}"
        elif eq:
            value = local_path(value)
        if name == "--events-log":
            events = value
        opts.append(f"{name}={value}" if eq else name)
    assert os.path.basename(argv[0]) == "lifeline-agent" and argv[1] == "run", argv[:2]
    replaced["the ranks' command"] = " ".join(argv[sep + 1:]) + " -> a command writing their variables"
    argv = [agent, "run"] + opts + ["--no-python-tracing", "--"] + rank_command(out)
    return argv, env, out, events, replaced


def pytorchjob_yaml_pods(tmp, etcd, agent):
    docs = manifest_docs("pytorchjob.yaml")
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    injected = check_manifests.pytorchjob_env(job)
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    template = worker["template"]
    container = next(c for c in template["spec"]["containers"] if c["name"] == "pytorch")
    pods, replaced = [], {}
    for i in range(worker.get("replicas", 1)):
        name = f"{job['metadata']['name']}-worker-{i}"
        refs = {"status.podIP": f"127.0.0.{i + 1}", "metadata.name": name}
        argv, env, out, events, replaced = materialise(template, container, injected, i, name, refs, tmp, etcd,
                                                       agent, configmaps)
        pods.append(Pod(name, i, argv, env, out, events))
    return pods, dict({k: v for k, v in injected.items() if v is not None}, **{"(replaced)": replaced})


def jobset_yaml_pods(tmp, etcd, agent):
    js = next(d for d in manifest_docs("jobset.yaml") if d["kind"] == "JobSet")
    rj = js["spec"]["replicatedJobs"][0]
    job = rj["template"]["spec"]
    template = job["template"]
    container = template["spec"]["containers"][0]
    pods, replaced = [], {}
    for i in range(job["parallelism"]):
        name = f"{js['metadata']['name']}-{rj['name']}-0-{i}-x{i}k2q"  # an Indexed Job's pod: random suffix
        refs = {"status.podIP": f"127.0.0.{i + 1}", "metadata.name": name,
                "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(i),
                "metadata.labels['jobset.sigs.k8s.io/jobset-name']": js["metadata"]["name"]}
        argv, env, out, events, replaced = materialise(template, container, {}, i, name, refs, tmp, etcd, agent, {})
        pods.append(Pod(name, i, argv, env, out, events))
    env0 = {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}
    return pods, dict({k: v for k, v in env0.items() if k.startswith("PET_")}, **{"(replaced)": replaced})


# ---------------------------------------------------------------------------------------------
# Running and judging


def run_pods(pods, tmp, order=None):
    for p in (order or pods):
        p.start(tmp)
        if order:
            time.sleep(0.5)
    deadline = time.time() + AGENT_TIMEOUT
    return [p.wait(deadline) for p in pods]


def judge_job(pods, codes, nodes, nproc, rank_by_index=False):
    """Faults of a job of `nodes` pods of `nproc` ranks each."""
    faults = []
    for p, rc in zip(pods, codes):
        if rc != 0:
            faults.append(f"{p.name}: the agent exited {rc}\n--- its output, last lines:\n"
                          + "\n".join(p.output().splitlines()[-15:]))
    world = nodes * nproc
    seen = {}
    group_of = {}
    for p in pods:
        files = sorted(os.listdir(p.out_dir))
        recs = []
        for fn in files:
            with open(os.path.join(p.out_dir, fn)) as f:
                recs.append(json.load(f))
        if len(recs) != nproc:
            faults.append(f"{p.name}: {len(recs)} ranks ran, expected {nproc} ({files})")
        groups = {r["GROUP_RANK"] for r in recs}
        if len(groups) != 1:
            faults.append(f"{p.name}: its ranks disagree on GROUP_RANK: {sorted(map(str, groups))}")
        group_of[p.name] = next(iter(groups)) if groups else None
        if rank_by_index and recs and str(p.index) not in groups:
            faults.append(f"{p.name}: GROUP_RANK {sorted(map(str, groups))}, but its PET_NODE_RANK is {p.index}")
        for r in recs:
            for k, want in (("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", nproc), ("GROUP_WORLD_SIZE", nodes)):
                if r.get(k) != str(want):
                    faults.append(f"{p.name}: rank {r.get('RANK')}: {k}={r.get(k)}, expected {want}")
            try:
                if int(r["RANK"]) != int(r["GROUP_RANK"]) * nproc + int(r["LOCAL_RANK"]):
                    faults.append(f"{p.name}: RANK {r['RANK']} is not GROUP_RANK {r['GROUP_RANK']} x {nproc} + "
                                  f"LOCAL_RANK {r['LOCAL_RANK']}")
            except (TypeError, ValueError, KeyError):
                faults.append(f"{p.name}: ranks' variables missing or not numbers: {r}")
            if r.get("LIFELINE_RESTART") != "0":
                faults.append(f"{p.name}: rank {r.get('RANK')}: LIFELINE_RESTART={r.get('LIFELINE_RESTART')}")
            seen.setdefault(r.get("RANK"), []).append(p.name)
    want = {str(r) for r in range(world)}
    if set(seen) != want or any(len(v) != 1 for v in seen.values()):
        faults.append(f"ranks seen {dict(sorted(seen.items(), key=lambda kv: str(kv[0])))}; expected 0..{world - 1} "
                      f"once each")
    if sorted(map(str, group_of.values())) != [str(g) for g in range(nodes)]:
        faults.append(f"group ranks {group_of}, expected 0..{nodes - 1} once each")
    masters, rank0_pod = set(), None
    for p in pods:
        for fn in os.listdir(p.out_dir):
            with open(os.path.join(p.out_dir, fn)) as f:
                r = json.load(f)
            masters.add((r.get("MASTER_ADDR"), r.get("MASTER_PORT")))
            if r.get("RANK") == "0":
                rank0_pod = p
    if len(masters) != 1:
        faults.append(f"ranks disagree on MASTER_ADDR:MASTER_PORT: {sorted(map(str, masters))}")
    elif nodes > 1 and rank0_pod is not None:
        addr = next(iter(masters))[0]
        host0 = next((a.split("=", 1)[1] for a in rank0_pod.argv if a.startswith("--node-host=")), None)
        if host0 is not None and addr != host0:
            faults.append(f"MASTER_ADDR {addr} is not the address of the pod holding rank 0 ({rank0_pod.name}: "
                          f"{host0})")
    for p in pods:
        if not p.events or not os.path.exists(p.events):
            continue
        with open(p.events) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        sched = [r for r in recs if r.get("action") == "scheduler"]
        if not sched or "torchrun" not in str(sched[0].get("scheduler")):
            faults.append(f"{p.name}: the events log has no scheduler record naming torchrun "
                          f"({[r.get('action') or r.get('kind') for r in recs][:8]})")
        else:
            read = set(sched[0].get("variables") or {})
            want_read = {k for k in p.env if k.startswith("PET_")}
            if read != want_read:
                faults.append(f"{p.name}: the agent says it read {sorted(read)}, the pod sets {sorted(want_read)}")
    return faults


def case_job(n, name, build, tmp, etcd, agent, order_reversed=False, rank_by_index=False):
    d = os.path.join(tmp, f"c{n}")
    os.makedirs(d)
    pods, shown = build(d, etcd, agent)
    print(f"== {name}: 2 pods, variables {json.dumps(shown, sort_keys=True)}")
    print(f"   {pods[0].name}: {' '.join(pods[0].argv[:-1])} '<ranks' command>'")
    t0 = time.time()
    codes = run_pods(pods, d, order=list(reversed(pods)) if order_reversed else None)
    faults = judge_job(pods, codes, nodes=2, nproc=2, rank_by_index=rank_by_index)
    rid = pods[0].env.get("PET_RDZV_ID")
    if not faults and rid:
        left = etcd.keys(f"/lifeline/{rid}/")
        if left:
            faults.append(f"the job's keys stay in etcd: {left[:5]}")
    print(f"   {'ok' if not faults else 'FAIL'} ({time.time() - t0:.1f} s): agents exited {codes}")
    for f in faults:
        print("   " + f.replace("\n", "\n   "))
    return faults


def case_c10d(tmp, etcd, agent):
    d = os.path.join(tmp, "c10d")
    os.makedirs(d)
    pods, operator = literal_pytorchjob_pods(d, etcd, agent)
    p = pods[0]
    p.env["PET_RDZV_BACKEND"] = "c10d"  # the operator's value when elasticPolicy.rdzvBackend is unset
    print("== c10d: one pod, PET_RDZV_BACKEND=c10d (rdzvBackend left to the operator's default)")
    t0 = time.time()
    p.start(d)
    rc = p.wait(time.time() + 30)
    out = p.output()
    faults = []
    if rc != 2:
        faults.append(f"the agent exited {rc}, expected 2")
    if "PET_RDZV_BACKEND" not in out or "etcd" not in out:
        faults.append("its message does not name PET_RDZV_BACKEND and etcd")
    if os.listdir(p.out_dir):
        faults.append(f"ranks ran: {os.listdir(p.out_dir)}")
    print(f"   {'ok' if not faults else 'FAIL'} ({time.time() - t0:.1f} s): exit {rc}: "
          f"{out.strip().splitlines()[-1] if out.strip() else '(no output)'}")
    for f in faults:
        print("   " + f)
    return faults


def case_flags_win(tmp, etcd, agent, tag, pet, flags, want_world):
    """One pod whose flags contradict its PET_ variables: the flags' job must form."""
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    pods, _ = literal_pytorchjob_pods(d, etcd, agent)
    p = pods[0]
    p.env.update(pet)
    sep = p.argv.index("--")
    p.argv[sep:sep] = flags
    print(f"== flags win: {' '.join(f'{k}={v}' for k, v in pet.items())} with {' '.join(flags)}")
    t0 = time.time()
    p.start(d)
    rc = p.wait(time.time() + 60)
    faults = []
    if rc != 0:
        faults.append(f"the agent exited {rc}, expected 0: {p.output().strip().splitlines()[-1:]}")
    recs = []
    for fn in sorted(os.listdir(p.out_dir)):
        with open(os.path.join(p.out_dir, fn)) as f:
            recs.append(json.load(f))
    got = sorted((r.get("RANK"), r.get("WORLD_SIZE")) for r in recs)
    if got != [(str(r), str(want_world)) for r in range(want_world)]:
        faults.append(f"expected ranks 0..{want_world - 1} of a world of {want_world}, got {got}")
    print(f"   {'ok' if not faults else 'FAIL'} ({time.time() - t0:.1f} s): exit {rc}, ranks {got}")
    for f in faults:
        print("   " + f)
    return faults


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    agent = os.path.abspath(a.agent)
    if not os.access(a.etcd, os.X_OK):
        print(f"SKIP: no etcd ({a.etcd}; Debian: etcd-server, tools/setup installs it)")
        return 77
    tmp = tempfile.mkdtemp(prefix="ll-pet-", dir="/tmp")
    etcd = Etcd(a.etcd, tmp)
    failed = []
    try:
        print(f"etcd on {etcd.endpoint}; agent {agent}; in {tmp}")
        for n, (name, fn, kw) in enumerate([
            ("pytorchjob-2:2 (the operator's variables, written out)", literal_pytorchjob_pods, {}),
            ("pytorchjob.yaml (elastic, PET_NNODES=1:2)", pytorchjob_yaml_pods, {}),
            ("jobset.yaml (PET_NODE_RANK from the completion index; node 1 first)", jobset_yaml_pods,
             {"order_reversed": True, "rank_by_index": True}),
        ]):
            if case_job(n, name, lambda d, e, ag, fn=fn: fn(d, e, ag)[:2], tmp, etcd, agent, **kw):
                failed.append(name)
        if case_c10d(tmp, etcd, agent):
            failed.append("c10d")
        if case_flags_win(tmp, etcd, agent, "f1", {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "3"},
                          ["--nnodes=1", "--nproc-per-node=2"], 2):
            failed.append("flags win (nodes, ranks)")
        if case_flags_win(tmp, etcd, agent, "f2", {"PET_NNODES": "2", "PET_RDZV_BACKEND": "c10d"},
                          ["--nnodes=1", "--rdzv-backend=etcd"], 2):
            failed.append("flags win (backend)")
    finally:
        etcd.stop()
        if not a.keep and not failed:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'FAILED: ' + ', '.join(failed) + f' (kept: {tmp})' if failed else 'all cases pass'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
