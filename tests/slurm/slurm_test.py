#!/usr/bin/env python3
"""lifeline-agent under a real Slurm (Debian's slurmctld and slurmd), on this one machine.

Starts a private Slurm cluster in a temporary directory: its own slurm.conf (free ports; state,
spool, pid files and logs in the directory; proctrack/linuxproc, no task plugin, no cgroups,
select/cons_tres, ReturnToService=2, JobRequeue=1, one partition), slurmctld and two slurmd, each
a node of its own (slurmd -N n1, -N n2 on their own ports; one node when this Slurm cannot run two
here), and a private etcd where the job's agents meet. Then each case submits
tools/slurm/lifeline.sbatch, the example users copy, with sbatch, running lifeline-drill under
lifeline-agent on every node of the allocation (2 ranks a node); the agents are given no
rendezvous flag but the endpoint:

  finish   the job ends COMPLETED; every rank's final state equals a clean run of as many ranks
  kill     a rank SIGKILLed at step 50 (the drill's crash@ fault) is named and restarted; the job
           still ends COMPLETED, equal to a clean run
  cancel   scancel of the running job stops every rank and agent; each agent logs its stop
  requeue  with --max-restarts 0, the SIGKILLed rank spends the restart budget: the agents exit 3,
           the script requeues the job, and the requeued run (SLURM_RESTART_COUNT=1) resumes from
           the checkpoint of the first and ends equal to a clean run

  slurm_test.py [--agent BIN] [--drill BIN] [--keep] CASE...   (CASE: a name above, or all)

Needs root, slurmctld, slurmd and the client commands (Debian: slurmctld, slurmd, slurm-client;
tools/setup installs them) and etcd (etcd-server); without them it says why and exits 77 (ctest's
skip). Exit status: 0 when every case passed, 1 otherwise. The binaries come from --agent/--drill,
else LIFELINE_AGENT_BIN/LIFELINE_DRILL_BIN, else build/bin of this checkout. LIFELINE_SLURM_AUTH
(none, slurm, munge) overrides the authentication chosen from the installed plugins;
LIFELINE_SLURM_NODES=1 runs one node. The directory is removed at the end unless a case failed or
--keep is given; whatever way the test ends (a SIGKILL included), a watchdog process stops every
process it started (found by a variable only they carry) and the Slurm daemons.
"""

import argparse
import glob
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SBATCH_SCRIPT = os.path.join(REPO, "tools", "slurm", "lifeline.sbatch")
AGENT_ON_NODE = os.path.join(HERE, "agent-on-node")
FIRST_RUN = os.path.join(HERE, "first-run")
MARK = "LIFELINE_SLURM_TEST"  # every process the test starts carries MARK=<its directory>
CASES = ["finish", "kill", "cancel", "requeue"]
RANKS_PER_NODE = 2
DRILL_ARGS = ["--steps", "200", "--ckpt-every", "10", "--compute-ms", "5"]
FINAL = re.compile(r"final rank=(\d+) (step=\d+ checksum=[0-9a-f]+)")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED", "SPECIAL_EXIT"}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def which(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin")


def wait_until(what, predicate, timeout, interval=0.25):
    """Polls predicate() until it returns a true value (returned) or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def marked_processes(mark_value, exclude=()):
    """The pids of processes whose environment holds MARK=mark_value."""
    want = f"{MARK}={mark_value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def kill_marked(mark_value, exclude=()):
    """SIGKILLs every process the test started (by its mark), until none is left (10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = marked_processes(mark_value, exclude)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


def reaper_main(directory):
    """The watchdog: when the test's pipe closes (it ended, however), nothing it started survives."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()  # EOF: the test is gone
    kill_marked(directory, exclude=(os.getpid(),))
    if not os.path.exists(os.path.join(directory, "KEEP")):
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The cluster


def slurm_version():
    out = subprocess.run([which("slurmd"), "-V"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0), out.strip()


def plugin_exists(name):
    """Whether Slurm's plugin NAME.so is installed (Debian: /usr/lib/<triplet>/slurm-wlm)."""
    return any(glob.glob(os.path.join(d, f"{name}.so")) for d in
               ("/usr/lib/*/slurm-wlm", "/usr/lib/slurm-wlm", "/usr/lib/*/slurm", "/usr/lib64/slurm", "/usr/lib/slurm",
                "/usr/local/lib/slurm"))


class Cluster:
    def __init__(self, directory, nodes, auth):
        self.dir = directory
        self.conf = os.path.join(directory, "etc", "slurm.conf")
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.auth = auth
        self.procs = {}  # name -> Popen
        self.host = socket.gethostname().split(".")[0]
        self.version, self.version_text = slurm_version()
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SLURMD_")):
                del self.env[k]  # a test run inside a Slurm job must not talk to that job's Slurm
        self.env["SLURM_CONF"] = self.conf
        self.env[MARK] = directory
        self.env["PATH"] = self.env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def write_config(self):
        for d in ("etc", "state", "log", "run", "spool"):
            os.makedirs(self.path(d), exist_ok=True)
        for n in self.nodes:
            os.makedirs(self.path("spool", n), exist_ok=True)
        os.chmod(self.path("etc"), 0o755)
        auth_info = ["cred_expire=15"]  # a requeued job waits this long before it starts again
        if self.auth == "none":
            auth_type, cred_type = "auth/none", "cred/none"
        elif self.auth == "slurm":  # Slurm 23.11+: its own authentication, a key beside slurm.conf
            auth_type, cred_type = "auth/slurm", "cred/slurm"
            key = self.path("etc", "slurm.key")
            with open(key, "wb") as f:
                f.write(secrets.token_bytes(1024))
            os.chmod(key, 0o600)
        else:  # munge, with a munged of our own
            auth_type, cred_type = "auth/munge", "cred/munge"
            auth_info.append(f"socket={self.path('munge', 'munge.socket')}")
        self.ctld_port = free_port()
        ports = [free_port() for _ in self.nodes]
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=lifeline",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={ports[0]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthType={auth_type}",
            f"CredType={cred_type}",
            f"AuthInfo={','.join(auth_info)}",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool', '%n')}",
            f"SlurmctldPidFile={self.path('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={self.path('run', 'slurmd.%n.pid')}",
            f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self.path('log', 'slurmd.%n.log')}",
            f"PlugStackConfig={self.path('etc', 'plugstack.conf')}",
            "MailProg=/bin/true",
            # No cgroups: processes are tracked through /proc; the task, accounting, MPI and switch
            # plugins are left at their defaults, none (Slurm 24 has no task/none to name).
            "ProctrackType=proctrack/linuxproc",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobRequeue=1",
            "MinJobAge=3600",  # finished jobs stay visible to scontrol show job
            # Job ids of their own: a test's job never shares a LIFELINE_JOB (slurm-<id>-<run>, which
            # names shared-memory segments) with a job of another cluster of a test run beside it.
            f"FirstJobId={secrets.randbelow(50_000_000) + 100_000}",
            "KillWait=30",
            "SchedulerParameters=sched_interval=2,bf_interval=1",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
        ]
        for n, port in zip(self.nodes, ports):
            lines.append(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
                         "State=UNKNOWN")
        lines.append("PartitionName=lifeline Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(self.path("etc", "plugstack.conf"), "w") as f:
            f.write("")
        if self.version >= (24, 5, 0):  # slurmd would set up cgroups even with no plugin using them
            with open(self.path("etc", "cgroup.conf"), "w") as f:
                f.write("CgroupPlugin=disabled\n")

    def spawn(self, name, argv, env=None):
        out = open(self.path("log", f"{name}.out"), "ab")
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            env=env or self.env, start_new_session=True)
        out.close()

    def run(self, argv, timeout=60, check_rc=True):
        r = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check_rc and r.returncode != 0:
            raise Failure(f"{' '.join(argv)}: exit {r.returncode}: {r.stdout}{r.stderr}")
        return r

    def start_munge(self):
        munged = which("munged")
        check(munged, "auth/munge needs munged (Debian: munge)")
        d = self.path("munge")
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o700)
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.spawn("munged", [munged, "--foreground", "--force", f"--socket={d}/munge.socket",
                              f"--key-file={key}", f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                              f"--seed-file={d}/munged.seed"])
        wait_until("munged's socket", lambda: os.path.exists(f"{d}/munge.socket"), 30)

    def start(self):
        self.write_config()
        if self.auth == "munge":
            self.start_munge()
        self.spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", self.conf])

        def ctld_up():
            self.alive("slurmctld")
            return self.run([which("scontrol"), "ping"], timeout=20, check_rc=False).stdout.find("UP") >= 0

        wait_until("slurmctld to answer", ctld_up, 60, 0.5)
        for n in self.nodes:
            self.spawn(f"slurmd.{n}", [which("slurmd"), "-D", "-N", n, "-f", self.conf])

        def nodes_idle():
            for n in self.nodes:
                self.alive(f"slurmd.{n}")
            out = self.run([which("sinfo"), "-h", "-N", "-o", "%N %T"], timeout=20, check_rc=False).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            return all(states.get(n) == "idle" for n in self.nodes)

        wait_until(f"nodes {','.join(self.nodes)} idle", nodes_idle, 90, 0.5)

    def alive(self, name):
        p = self.procs[name]
        if p.poll() is not None:
            tail = ""
            for f in (self.path("log", f"{name}.out"),):
                try:
                    with open(f, errors="replace") as fh:
                        tail += "".join(fh.readlines()[-15:])
                except OSError:
                    pass
            raise Failure(f"{name} exited with {p.returncode}:\n{tail}")

    def stop(self):
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run([which("scancel"), "--partition=lifeline"], timeout=20, check_rc=False)
            except (subprocess.TimeoutExpired, OSError):
                pass
        order = [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 15
        for name in order:
            p = self.procs.get(name)
            if p:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = {}

    # ---- jobs ----

    def sbatch(self, case_dir, name, train, env_extra, nodes):
        env = dict(self.env, **env_extra)
        argv = [which("sbatch"), "--parsable", f"--nodes={nodes}", f"--job-name={name}",
                f"--output={os.path.join(case_dir, 'job.out')}", SBATCH_SCRIPT] + train
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd=case_dir)
        if r.returncode != 0:
            raise Failure(f"sbatch: exit {r.returncode}: {r.stdout}{r.stderr}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id):
        """scontrol's fields of the job (JobState, ExitCode, Restarts, ...)."""
        r = self.run([which("scontrol"), "show", "job", "-o", job_id], timeout=30, check_rc=False)
        fields = {}
        for tok in r.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def wait_job(self, job_id, timeout, restarts=0):
        """Waits for the job to end (after `restarts` requeues); returns its fields."""
        def ended():
            for name in self.procs:
                self.alive(name)
            f = self.job(job_id)
            if f.get("JobState") in TERMINAL and int(f.get("Restarts", "0")) >= restarts:
                return f
            return None

        return wait_until(f"job {job_id} to end", ended, timeout, 1.0)


def start_etcd(directory, env):
    etcd = which("etcd")
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever *_proxy says
    for _ in range(4):
        client, peer = free_port(), free_port()
        shutil.rmtree(os.path.join(directory, "etcd"), ignore_errors=True)
        out = open(os.path.join(directory, "log", "etcd.out"), "ab")
        p = subprocess.Popen([etcd, "--name", "slurmtest", "--data-dir", os.path.join(directory, "etcd"),
                              "--listen-client-urls", f"http://127.0.0.1:{client}",
                              "--advertise-client-urls", f"http://127.0.0.1:{client}",
                              "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                              "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                              "--initial-cluster", f"slurmtest=http://127.0.0.1:{peer}"],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        out.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and p.poll() is None:
            try:
                with direct.open(f"http://127.0.0.1:{client}/health", timeout=2) as r:
                    if r.status == 200:
                        return p, f"127.0.0.1:{client}"
            except OSError:
                pass
            time.sleep(0.2)
        p.kill()
        p.wait()  # a port taken meanwhile, most likely: new ports
    raise Failure(f"etcd did not start (log: {directory}/log/etcd.out)")


# ---------------------------------------------------------------------------------------------
# The cases


class Suite:
    def __init__(self, args, directory, cluster, etcd_endpoint):
        self.args = args
        self.dir = directory
        self.cluster = cluster
        self.etcd = etcd_endpoint
        self.nodes = len(cluster.nodes)
        self.world = self.nodes * RANKS_PER_NODE
        self._reference = None

    def reference(self):
        """Every rank's final line of a clean run of the drill, one agent of `world` ranks."""
        if self._reference is None:
            d = os.path.join(self.dir, "reference")
            os.makedirs(d)
            env = dict(self.cluster.env, LIFELINE_MEMORY_TIER_DIR=os.path.join(d, "tier"))
            r = subprocess.run([self.args.agent, "run", "--nproc", str(self.world), "--master-port", "0", "--",
                                self.args.drill, "--dir", os.path.join(d, "ckpt")] + DRILL_ARGS,
                               capture_output=True, text=True, env=env, timeout=300)
            finals = {int(m.group(1)): m.group(2) for m in FINAL.finditer(r.stdout)}
            check(r.returncode == 0 and len(finals) == self.world,
                  f"the clean reference run failed (exit {r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
            self._reference = finals
        return self._reference

    def submit(self, case, train, extra_env=None, agent_args=""):
        case_dir = os.path.join(self.dir, case)
        os.makedirs(case_dir)
        env = {
            "ETCD": self.etcd,
            "GPUS": str(RANKS_PER_NODE),
            "CHECKPOINT_DIR": os.path.join(case_dir, "ckpt"),
            "LIFELINE_AGENT": AGENT_ON_NODE,
            "LIFELINE_AGENT_BIN": self.args.agent,
            "LIFELINE_AGENT_ARGS": agent_args,
            "LIFELINE_SLURM_CASE_DIR": case_dir,
        }
        env.update(extra_env or {})
        job_id = self.cluster.sbatch(case_dir, f"lifeline-{case}", train, env, self.nodes)
        log(f"{case}: submitted job {job_id} ({self.nodes} node(s) x {RANKS_PER_NODE} ranks)")
        return job_id, case_dir

    def drill(self, case_dir):
        return [self.args.drill, "--dir", os.path.join(case_dir, "ckpt")]

    @staticmethod
    def read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def events(self, case_dir, node, run=0):
        lines = []
        for line in self.read(os.path.join(case_dir, f"events.{node}.run{run}.jsonl")).splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                raise Failure(f"events.{node}.run{run}.jsonl: not JSON: {line!r}")
        return lines

    def runs_of_output(self, case_dir):
        """job.out split by lifeline.sbatch's header line into {run: text}."""
        runs, current = {}, None
        for line in self.read(os.path.join(case_dir, "job.out")).splitlines(keepends=True):
            m = re.match(r"lifeline\.sbatch: job \d+ run (\d+) on ", line)
            if m:
                current = int(m.group(1))
            runs[current] = runs.get(current, "") + line
        return runs

    def check_finals(self, text, what):
        finals = {int(m.group(1)): m.group(2) for m in FINAL.finditer(text)}
        check(sorted(finals) == list(range(self.world)),
              f"{what}: final lines of ranks {sorted(finals)}, want 0..{self.world - 1} (world {self.world})")
        check(finals == self.reference(), f"{what}: final states differ from a clean run:\n  got  {finals}\n"
                                          f"  want {self.reference()}")

    def check_slurm_rendezvous(self, case_dir, job_id, run=0):
        """Each node's agent met the others as Slurm said: its own node, the job id as LIFELINE_JOB."""
        for node in self.cluster.nodes:
            ev = self.events(case_dir, node, run)
            check(ev, f"node {node} wrote no events log (run {run})")
            launches = [e for e in ev if e.get("action") == "launch"]
            check(launches, f"node {node}: no launch in its events log")
            check(all(e.get("world_size") == self.world for e in launches),
                  f"node {node}: launched in world(s) {[e.get('world_size') for e in launches]}, want {self.world}")
            jobs = {str(e.get("job", "")) for e in ev}
            want = f"slurm-{job_id}-{run}"  # the rendezvous id the agent derives from Slurm's variables
            check(jobs == {want}, f"node {node}: events name job(s) {jobs}, want {want}")

    def describe_failure(self, case_dir, job_id):
        parts = [f"--- scontrol show job {job_id}: {self.cluster.job(job_id)}"]
        parts.append("--- job.out (last 60 lines):\n" +
                     "".join(self.read(os.path.join(case_dir, "job.out")).splitlines(True)[-60:]))
        for f in sorted(glob.glob(os.path.join(case_dir, "events.*.jsonl"))):
            parts.append(f"--- {os.path.basename(f)}:\n" + "".join(
                line for line in self.read(f).splitlines(True) if '"usage"' not in line)[-4000:])
        return "\n".join(parts)

    # ---- a: a clean job across the allocation ----
    def case_finish(self):
        job_id, case_dir = self.submit("finish", self.drill(self.case_dir_of("finish")) + DRILL_ARGS)
        try:
            f = self.cluster.wait_job(job_id, 300)
            check(f.get("JobState") == "COMPLETED" and f.get("ExitCode") == "0:0",
                  f"job {job_id} ended {f.get('JobState')} {f.get('ExitCode')}, want COMPLETED 0:0")
            self.check_slurm_rendezvous(case_dir, job_id)
            self.check_finals(self.runs_of_output(case_dir).get(0, ""), "finish")
            for node in self.cluster.nodes:
                ev = self.events(case_dir, node)
                check(any(e.get("action") == "finished" for e in ev), f"node {node}: no 'finished' in its log")
                check(not any("kind" in e for e in ev), f"node {node}: anomalies in a clean run: "
                      f"{[e for e in ev if 'kind' in e]}")
            return f"world {self.world} on {self.nodes} node(s), every final state equal to a clean run"
        except Failure as e:
            raise Failure(f"{e}\n{self.describe_failure(case_dir, job_id)}")

    def case_dir_of(self, case):
        return os.path.join(self.dir, case)

    # ---- b: a rank SIGKILLed mid-job is restarted ----
    def case_kill(self):
        victim = self.world - 1  # on the last node
        job_id, case_dir = self.submit("kill", self.drill(self.case_dir_of("kill")) + DRILL_ARGS +
                                       ["--fault", f"crash@{victim}:50"])
        try:
            f = self.cluster.wait_job(job_id, 300)
            check(f.get("JobState") == "COMPLETED" and f.get("ExitCode") == "0:0",
                  f"job {job_id} ended {f.get('JobState')} {f.get('ExitCode')}, want COMPLETED 0:0")
            self.check_slurm_rendezvous(case_dir, job_id)
            victim_node = self.cluster.nodes[victim // RANKS_PER_NODE]
            dead = [e for e in self.events(case_dir, victim_node) if e.get("kind") == "dead"]
            check(dead and dead[0].get("ranks") == [victim],
                  f"node {victim_node}: want one 'dead' anomaly naming rank {victim}, got {dead}")
            others = [e for n in self.cluster.nodes for e in self.events(case_dir, n)
                      if "kind" in e and e.get("ranks") != [victim]]
            check(not others, f"anomalies naming other ranks: {others}")
            for node in self.cluster.nodes:
                ev = self.events(case_dir, node)
                check(any(e.get("action") == "restart" for e in ev) or any(e.get("restart", 0) >= 1 for e in ev),
                      f"node {node}: its ranks were not relaunched")
                check(any(e.get("action") == "finished" for e in ev), f"node {node}: no 'finished' in its log")
            out = self.runs_of_output(case_dir).get(0, "")
            resumed = set(re.findall(r"rank \d+ resumed from step (\d+)", out))
            check(resumed and all(int(s) < 50 for s in resumed),
                  f"the relaunched ranks resumed from {resumed or 'nothing'}, want one step before 50")
            self.check_finals(out, "kill")
            return (f"rank {victim} on {victim_node} SIGKILLed at step 50, named 'dead'; relaunched from step "
                    f"{','.join(sorted(resumed))}; final states equal to a clean run")
        except Failure as e:
            raise Failure(f"{e}\n{self.describe_failure(case_dir, job_id)}")

    # ---- c: scancel stops every rank ----
    def case_cancel(self):
        case_dir = self.case_dir_of("cancel")
        job_id, case_dir = self.submit("cancel", self.drill(case_dir) +
                                       ["--steps", "100000000", "--ckpt-every", "10", "--compute-ms", "10"])
        ckpt = os.path.join(case_dir, "ckpt")

        def ranks_running():
            pids = [p for p in marked_processes(self.dir) if ckpt in cmdline(p) and
                    os.path.basename(cmdline(p)[0]) == os.path.basename(self.args.drill)]
            return pids

        try:
            def all_stepping():
                for name in self.cluster.procs:
                    self.cluster.alive(name)
                f = self.cluster.job(job_id)
                check(f.get("JobState") not in TERMINAL, f"job {job_id} ended early: {f.get('JobState')}")
                out = self.read(os.path.join(case_dir, "job.out"))
                saved = {int(r) for r in re.findall(r"\[rank (\d+)\] checkpoint step=", out)}
                return len(saved) == self.world and len(ranks_running()) == self.world

            wait_until(f"all {self.world} ranks of job {job_id} to checkpoint", all_stepping, 240, 0.5)
            pids = ranks_running()
            log(f"cancel: ranks running (pids {pids}); scancel {job_id}")
            t0 = time.monotonic()
            self.cluster.run([which("scancel"), job_id])
            wait_until("every rank to end", lambda: not ranks_running(), 120, 0.2)
            ranks_gone = time.monotonic() - t0
            agent_name = os.path.basename(self.args.agent)

            def agents_gone():
                return not [p for p in marked_processes(self.dir)
                            if any(case_dir in a for a in cmdline(p)) and
                            os.path.basename((cmdline(p) or [""])[0]) == agent_name]

            wait_until("every agent to end", agents_gone, 120, 0.2)
            f = self.cluster.wait_job(job_id, 120)
            check(f.get("JobState") == "CANCELLED", f"job {job_id} ended {f.get('JobState')}, want CANCELLED")
            # scancel signals every process of the job's steps, the ranks as well as the agents: a
            # rank ended so is the cancellation, not a fault to name or restart.
            problems = []
            for node in self.cluster.nodes:
                ev = self.events(case_dir, node)
                if not any("SIGTERM" in str(e.get("reason", "")) for e in ev
                           if e.get("action") in ("stop", "give_up")):
                    problems.append(f"node {node}: no stop or give_up naming SIGTERM in its events log")
                anomalies = [e.get("message", e.get("kind")) for e in ev if "kind" in e]
                if anomalies:
                    problems.append(f"node {node}: the cancellation logged as anomalies: {anomalies}")
                restarts = [e.get("reason") for e in ev if e.get("action") == "restart"]
                if restarts:
                    problems.append(f"node {node}: restart(s) decided after scancel: {restarts}")
                relaunches = [e for e in ev if e.get("action") == "launch" and e.get("restart", 0) >= 1]
                if relaunches:
                    problems.append(f"node {node}: ranks relaunched after scancel")
            check(not problems, "; ".join(problems))
            return f"{self.world} ranks stopped {ranks_gone:.1f} s after scancel; every agent logged its stop"
        except Failure as e:
            raise Failure(f"{e}\n{self.describe_failure(case_dir, job_id)}")

    # ---- d: a spent budget requeues; the requeued run resumes ----
    def case_requeue(self):
        victim = self.world - 1
        case_dir = self.case_dir_of("requeue")
        job_id, case_dir = self.submit("requeue", [FIRST_RUN] + self.drill(case_dir) + DRILL_ARGS,
                                       extra_env={"FIRST_RUN_ARGS": f"--fault crash@{victim}:30"},
                                       agent_args="--max-restarts 0")
        try:
            f = self.cluster.wait_job(job_id, 420, restarts=1)
            runs = self.runs_of_output(case_dir)
            check("lifeline-agent exited 3\nlifeline.sbatch: a requeue may help: requeueing" in runs.get(0, ""),
                  "the first run's agents did not exit 3 and requeue")
            check(f.get("JobState") == "COMPLETED" and f.get("ExitCode") == "0:0",
                  f"job {job_id} ended {f.get('JobState')} {f.get('ExitCode')}, want COMPLETED 0:0")
            check(f.get("Restarts") == "1", f"job {job_id} was requeued {f.get('Restarts')} times, want 1")
            for node in self.cluster.nodes:
                first = self.events(case_dir, node, 0)
                ended = [e for e in first if e.get("action") in ("give_up", "stop")]
                check(any(e.get("exit_code") == 3 or "requeue may help" in str(e.get("reason", "")) for e in ended),
                      f"node {node}: run 0 did not end as 'a requeue may help': {ended}")
                second = self.events(case_dir, node, 1)
                check(any(e.get("action") == "finished" for e in second), f"node {node}: run 1 did not finish")
            self.check_slurm_rendezvous(case_dir, job_id, run=1)
            out = runs.get(1, "")
            check(out, "no output of the requeued run (run 1)")
            resumed = {int(r): int(s) for r, s in re.findall(r"rank (\d+) resumed from step (\d+)", out)}
            check(sorted(resumed) == list(range(self.world)) and len(set(resumed.values())) == 1,
                  f"the requeued run's ranks resumed from {resumed}, want every rank from one step")
            step = next(iter(resumed.values()))
            check(10 <= step < 30, f"the requeued run resumed from step {step}, want the first run's, before 30")
            self.check_finals(out, "requeue")
            return (f"rank {victim} SIGKILLed at step 30 with no restart left: exit 3, requeued; run 1 "
                    f"resumed from step {step}; final states equal to a clean run")
        except Failure as e:
            raise Failure(f"{e}\n{self.describe_failure(case_dir, job_id)}")


# ---------------------------------------------------------------------------------------------


def skip_reason(args):
    if os.geteuid() != 0:
        return "not root: slurmd and slurmctld of a private cluster run as root here"
    for name in ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo"):
        if not which(name):
            return f"no {name} (Debian: slurmctld, slurmd, slurm-client; tools/setup installs them)"
    if not which("etcd"):
        return "no etcd (Debian: etcd-server; tools/setup installs it)"
    for what, path in (("agent", args.agent), ("drill", args.drill)):
        if not (path and os.access(path, os.X_OK)):
            return f"no {what} binary at {path!r} (--{what}, LIFELINE_{what.upper()}_BIN)"
    return None


def choose_auth():
    forced = os.environ.get("LIFELINE_SLURM_AUTH")
    if forced:
        return forced
    if plugin_exists("auth_none") and plugin_exists("cred_none"):
        return "none"
    if plugin_exists("auth_slurm"):
        return "slurm"
    return "munge"


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--reaper":
        reaper_main(sys.argv[2])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cases", nargs="+", choices=CASES + ["all"])
    p.add_argument("--agent", default=os.environ.get("LIFELINE_AGENT_BIN",
                                                     os.path.join(REPO, "build", "bin", "lifeline-agent")))
    p.add_argument("--drill", default=os.environ.get("LIFELINE_DRILL_BIN",
                                                     os.path.join(REPO, "build", "bin", "lifeline-drill")))
    p.add_argument("--keep", action="store_true", help="keep the directory (logs, checkpoints)")
    args = p.parse_args()
    args.agent = os.path.abspath(args.agent)
    args.drill = os.path.abspath(args.drill)
    cases = CASES if "all" in args.cases else list(dict.fromkeys(args.cases))
    reason = skip_reason(args)
    if reason:
        print(f"SKIP: {reason}", flush=True)
        return SKIP

    directory = tempfile.mkdtemp(prefix="lifeline-slurm-")
    os.chmod(directory, 0o755)
    reaper_env = {k: v for k, v in os.environ.items() if k != MARK}
    reaper = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reaper", directory],
                              stdin=subprocess.PIPE, env=reaper_env, start_new_session=True)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    results = {}
    keep = args.keep
    cluster = etcd = None
    try:
        nodes = int(os.environ.get("LIFELINE_SLURM_NODES", "2"))
        auth = choose_auth()
        version = slurm_version()[1]
        cluster = Cluster(directory, nodes, auth)
        t0 = time.monotonic()
        try:
            cluster.start()
        except Failure as e:
            if nodes < 2:
                raise
            log(f"two slurmd on this machine did not come up ({str(e).splitlines()[0]}); one node instead")
            cluster.stop()
            shutil.rmtree(os.path.join(directory, "state"), ignore_errors=True)
            cluster = Cluster(directory, 1, auth)
            cluster.start()
        etcd, endpoint = start_etcd(directory, cluster.env)
        log(f"{version}: slurmctld and {len(cluster.nodes)} slurmd ({','.join(cluster.nodes)}), auth/{auth}, "
            f"etcd at {endpoint}, in {directory} ({time.monotonic() - t0:.1f} s)")
        suite = Suite(args, directory, cluster, endpoint)
        for case in cases:
            t = time.monotonic()
            try:
                detail = getattr(suite, f"case_{case}")()
                results[case] = True
                log(f"PASS {case} ({time.monotonic() - t:.1f} s): {detail}")
            except Failure as e:
                results[case] = False
                keep = True
                log(f"FAIL {case} ({time.monotonic() - t:.1f} s): {e}")
    except (Failure, subprocess.TimeoutExpired) as e:
        keep = True
        log(f"FAIL: the cluster: {e}")
        for name in ("slurmctld.log", "slurmd.n1.log", "slurmd.n2.log"):
            path = os.path.join(directory, "log", name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    log(f"--- {name} (last 20 lines):\n" + "".join(f.readlines()[-20:]))
    except KeyboardInterrupt as e:
        keep = True
        log(f"interrupted ({e})")
    finally:
        if cluster:
            cluster.stop()
        if etcd:
            etcd.kill()
            etcd.wait()
        kill_marked(directory, exclude=(os.getpid(), reaper.pid))
        if keep:
            open(os.path.join(directory, "KEEP"), "w").close()
            log(f"kept {directory}")
        reaper.stdin.close()
        reaper.wait()
    for case in cases:
        if case not in results:
            results[case] = False
    summary = " ".join(f"{c}={'PASS' if ok else 'FAIL'}" for c, ok in results.items())
    log(f"summary: {summary}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
