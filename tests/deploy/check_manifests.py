#!/usr/bin/env python3
"""The Kubernetes manifests of tools/deploy/kubernetes/ parse, and name only what exists.

Usage: check_manifests.py --agent PATH/lifeline-agent [--root REPO]   check (exit 1 naming each fault)
       check_manifests.py --agent PATH/lifeline-agent --self-test     every check refuses a broken copy

The checks, each naming the file and the field at fault:

  kinds     every document has a known apiVersion and kind and a valid metadata.name
  fields    the PyTorchJob, JobSet, PodMonitor, pod, container and volume fields are ones their APIs
            define (a misspelt field is dropped by the API server without a word)
  image     every container runs the image tools/deploy/Dockerfile builds, and its command[0], and
            the rank command after lifeline-agent's `--` (program and script), exist in that image:
            the programs of its base, of the Debian packages and pip packages it installs, the
            wheel's commands (pyproject.toml's [project.scripts]) and the files it copies
  flags     every lifeline-agent flag used is in `lifeline-agent run --help`; a --config file is
            a key of a mounted ConfigMap, the agent accepts it, and it sets nothing the pod's PET_
            variables set (the file would win over them)
  env       every variable set in an agent's container is one the code reads (its name in agent/
            or lib/, or PET_<FLAG> of a flag of `run --help` once the agent reads PET_ variables),
            or one the command uses as $(NAME); every $(NAME) is set; fieldRefs are downward-API
            fields, a completion index only in an Indexed Job
  job       the job the agent forms from what the operator sets (Kubeflow's elastic variables,
            simulated as training-operator v1.9 sets them) and the pod's own: ranks per node a
            number, nodes MIN[:MAX] matching the replicas, an etcd rendezvous backend, a rendezvous
            id, and the endpoint an etcd Service of these manifests whose port leads to an etcd
            container listening on it
  monitor   the PodMonitor selects the training pods, its ports are named ports of theirs that
            the agent serves (--metrics-addr on all addresses), its jobLabel is a label they carry
  tier      the memory tier (LIFELINE_MEMORY_TIER_DIR, else /dev/shm) is mounted exactly there
            from an emptyDir of medium Memory with a sizeLimit
  storage   --checkpoint-dir lies on a PersistentVolumeClaim of these manifests that is
            ReadWriteMany; the events log's directory is a mount; the script's --dir, if any, is
            the checkpoint directory

--self-test first checks that the manifests pass, then breaks one thing at a time in a copy held
in memory (a port renamed, a flag that does not exist, a mount moved, ...) and requires the check
meant for it to fail, naming it.
"""

import argparse
import copy
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

KNOWN_KINDS = {
    ("v1", "Service"), ("v1", "ConfigMap"), ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "StatefulSet"),
    ("kubeflow.org/v1", "PyTorchJob"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}

# Field names of the APIs the manifests use (Kubernetes 1.31 core/batch/apps; Kubeflow training
# operator v1.9 PyTorchJob; JobSet v1alpha2; Prometheus Operator v1 PodMonitor). Only what the
# manifests may reasonably hold: a field outside these sets is reported, so that a typo is caught.
FIELDS = {
    "pytorchjob.spec": {"runPolicy", "elasticPolicy", "pytorchReplicaSpecs", "nprocPerNode"},
    "pytorchjob.elasticPolicy": {"minReplicas", "maxReplicas", "rdzvBackend", "rdzvPort", "rdzvHost", "rdzvId",
                                 "rdzvConf", "standalone", "nProcPerNode", "maxRestarts", "metrics"},
    "pytorchjob.runPolicy": {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
                             "schedulingPolicy", "suspend", "managedBy"},
    "pytorchjob.replicaSpec": {"replicas", "template", "restartPolicy"},
    "jobset.spec": {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
                    "coordinator", "managedBy", "ttlSecondsAfterFinished"},
    "jobset.network": {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"},
    "jobset.failurePolicy": {"maxRestarts", "restartStrategy", "rules"},
    "jobset.replicatedJob": {"name", "groupName", "template", "replicas", "dependsOn"},
    "job.spec": {"parallelism", "completions", "completionMode", "backoffLimit", "backoffLimitPerIndex",
                 "maxFailedIndexes", "podFailurePolicy", "successPolicy", "activeDeadlineSeconds",
                 "ttlSecondsAfterFinished", "template", "suspend", "podReplacementPolicy", "manualSelector",
                 "selector", "managedBy"},
    "statefulset.spec": {"serviceName", "replicas", "selector", "template", "volumeClaimTemplates",
                         "podManagementPolicy", "updateStrategy", "revisionHistoryLimit", "minReadySeconds",
                         "persistentVolumeClaimRetentionPolicy", "ordinals"},
    "service.spec": {"selector", "ports", "clusterIP", "type", "publishNotReadyAddresses", "sessionAffinity",
                     "ipFamilyPolicy", "internalTrafficPolicy"},
    "service.port": {"name", "port", "targetPort", "protocol", "appProtocol", "nodePort"},
    "pvc.spec": {"accessModes", "resources", "storageClassName", "volumeMode", "volumeName", "selector",
                 "dataSource", "dataSourceRef", "volumeAttributesClassName"},
    "podmonitor.spec": {"jobLabel", "podTargetLabels", "podMetricsEndpoints", "selector", "namespaceSelector",
                        "sampleLimit", "targetLimit", "attachMetadata", "scrapeProtocols"},
    "podmonitor.endpoint": {"port", "portNumber", "targetPort", "path", "scheme", "params", "interval",
                            "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings",
                            "metricRelabelings", "basicAuth", "bearerTokenSecret", "tlsConfig",
                            "followRedirects", "enableHttp2", "filterRunning", "proxyUrl", "authorization",
                            "oauth2"},
    "pod.template": {"metadata", "spec"},
    "pod.spec": {"containers", "initContainers", "volumes", "restartPolicy", "terminationGracePeriodSeconds",
                 "shareProcessNamespace", "nodeSelector", "affinity", "tolerations", "serviceAccountName",
                 "securityContext", "priorityClassName", "schedulerName", "hostname", "subdomain",
                 "dnsPolicy", "hostNetwork", "hostIPC", "imagePullSecrets", "topologySpreadConstraints",
                 "runtimeClassName", "enableServiceLinks", "activeDeadlineSeconds"},
    "container": {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports", "resources",
                  "volumeMounts", "workingDir", "readinessProbe", "livenessProbe", "startupProbe",
                  "securityContext", "lifecycle", "terminationMessagePolicy", "terminationMessagePath",
                  "stdin", "tty", "restartPolicy", "volumeDevices", "resizePolicy"},
    "container.port": {"name", "containerPort", "protocol", "hostPort", "hostIP"},
    "env": {"name", "value", "valueFrom"},
    "volumeMount": {"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation",
                    "recursiveReadOnly"},
    "volume": {"name", "emptyDir", "persistentVolumeClaim", "configMap", "secret", "hostPath", "projected",
               "downwardAPI", "ephemeral", "nfs", "csi"},
    "emptyDir": {"medium", "sizeLimit"},
}
RDZV_BACKENDS = {"c10d", "etcd", "etcd-v2"}               # training-operator v1.9's enum
AGENT_RDZV_BACKENDS = {"etcd", "etcd-v2"}                  # what lifeline-agent meets through
PYTORCHJOB_CONTAINER = "pytorch"                           # the operator's default container name
DOWNWARD_FIELDS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                   "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP",
                   "status.podIPs"}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# What a program name means in the image: Debian packages' programs (only those the manifests may
# run), the Debian base image's programs, and a venv's.
APT_PROGRAMS = {
    "python3": ["/usr/bin/python3", "/usr/bin/python3.11"],
    "python3-minimal": ["/usr/bin/python3"],
    "etcd-server": ["/usr/bin/etcd"],
    "etcd-client": ["/usr/bin/etcdctl"],
    "tini": ["/usr/bin/tini"],
    "curl": ["/usr/bin/curl"],
}
BASE_PROGRAMS = {"debian": ["/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/env", "/bin/true",
                            "/usr/bin/true", "/bin/sleep", "/usr/bin/sleep", "/bin/cat", "/usr/bin/cat"]}
DEFAULT_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]


# ---------------------------------------------------------------------------------------------
# Inputs


class Bundle:
    """Everything the checks look at; the self-test breaks copies of it."""

    def __init__(self, docs, dockerfile, scripts, help_text, code_names, reads_pet, agent):
        self.docs = docs              # [(file, index, document)]
        self.dockerfile = dockerfile  # text
        self.scripts = scripts        # the wheel's commands (pyproject.toml)
        self.help_text = help_text    # `lifeline-agent run --help`
        self.code_names = code_names  # quoted UPPER_CASE names in agent/ and lib/
        self.reads_pet = reads_pet    # whether the agent's sources read PET_ variables at all
        self.agent = agent            # the binary, to try a --config file


def load_manifests(root):
    docs = []
    files = sorted(glob.glob(os.path.join(root, "tools/deploy/kubernetes/*.yaml")))
    if not files:
        raise SystemExit("no manifests under " + os.path.join(root, "tools/deploy/kubernetes"))
    for path in files:
        name = os.path.relpath(path, root)
        with open(path) as f:
            try:
                loaded = list(yaml.safe_load_all(f))
            except yaml.YAMLError as e:
                raise SystemExit(f"{name}: does not parse as YAML: {e}")
        for i, doc in enumerate(loaded):
            if doc is not None:
                docs.append((name, i, doc))
    return docs


def wheel_scripts(root):
    path = os.path.join(root, "pyproject.toml")
    with open(path, "rb") as f:
        data = f.read()
    if tomllib is not None:
        return sorted(tomllib.loads(data.decode()).get("project", {}).get("scripts", {}))
    m = re.search(r"^\[project\.scripts\]\n(.*?)(^\[|\Z)", data.decode(), re.M | re.S)
    return sorted(re.findall(r"^([A-Za-z0-9_.-]+)\s*=", m.group(1), re.M)) if m else []


def code_names(root):
    """Quoted UPPER_CASE names in the agent's and the library's sources: the variables they read."""
    names, pet = set(), False
    for top in ("agent", "lib"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for fn in filenames:
                if not re.search(r"\.(cc|h|py)$", fn) or re.search(r"_test\.(cc|py)$", fn):
                    continue
                with open(os.path.join(dirpath, fn), errors="replace") as f:
                    text = f.read()
                names.update(re.findall(r"\"([A-Z][A-Z0-9_]{2,})\"", text))
                if top == "agent" and '"PET_' in text:
                    pet = True
    return names, pet


def agent_help(agent):
    r = subprocess.run([agent, "run", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=30)
    if r.returncode != 0:
        raise SystemExit(f"{agent} run --help: exit {r.returncode}\n{r.stdout}")
    return r.stdout


def load_bundle(root, agent):
    with open(os.path.join(root, "tools/deploy/Dockerfile")) as f:
        dockerfile = f.read()
    names, pet = code_names(root)
    return Bundle(load_manifests(root), dockerfile, wheel_scripts(root), agent_help(agent), names, pet, agent)


# ---------------------------------------------------------------------------------------------
# The image, from the Dockerfile


class Image:
    def __init__(self, tag_name, files, path):
        self.tag_name = tag_name  # the repository name the manifests must use: "lifeline"
        self.files = files        # absolute paths of the programs and files it holds
        self.path = path          # PATH

    def resolve(self, program):
        if program.startswith("/"):
            return program if program in self.files else None
        for d in self.path:
            if d + "/" + program in self.files:
                return d + "/" + program
        return None


def parse_dockerfile(text, scripts):
    """The final stage's contents, as far as the manifests need them."""
    lines, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        lines.append(cur + line)
        cur = ""
    if cur:
        lines.append(cur)
    args = {}
    stages = []  # [[instruction lines]]
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.strip())
        if word == "ARG":
            k, _, v = rest.partition("=")
            args.setdefault(k.strip(), v.strip().strip('"'))
            if stages:
                continue
        if word == "FROM":
            stages.append([(word, rest)])
        elif stages:
            stages[-1].append((word, rest))
    if not stages:
        raise ValueError("tools/deploy/Dockerfile: no FROM")
    final = stages[-1]
    base = final[0][1].split()[0]
    files = set()
    if base.split(":")[0].split("/")[-1] in ("debian", "python"):
        files.update(BASE_PROGRAMS["debian"])
    path = list(DEFAULT_PATH)
    venvs = set()
    for word, rest in final[1:]:
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest)
        if word == "RUN":
            for cmd in re.split(r"&&|;|\|\|", rest):
                try:
                    argv = shlex.split(cmd)
                except ValueError:
                    argv = cmd.split()
                if not argv:
                    continue
                if argv[:2] == ["apt-get", "install"] or argv[:2] == ["apt", "install"]:
                    for pkg in argv[2:]:
                        if not pkg.startswith("-"):
                            files.update(APT_PROGRAMS.get(pkg.split("=")[0], []))
                if len(argv) >= 4 and argv[1:3] == ["-m", "venv"]:
                    venv = argv[-1]
                    venvs.add(venv)
                    files.update(venv + "/bin/" + p for p in ("python", "python3", "pip", "pip3"))
                m = re.match(r"(.*)/bin/pip3?$", argv[0])
                if m and m.group(1) in venvs and len(argv) > 1 and argv[1] == "install":
                    for a in argv[2:]:
                        if re.match(r"^torch(==|>=|$)", a):
                            files.add(m.group(1) + "/bin/torchrun")
                        if re.search(r"(^|/)lifeline-[^/]*\.whl$", a) or a in (".", "/src"):
                            files.update(m.group(1) + "/bin/" + s for s in scripts)
        elif word == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", rest):
                if k == "PATH":
                    path = [p for p in v.split(":") if p and p != "$PATH"] + (path if "$PATH" in v else [])
        elif word == "COPY":
            parts = shlex.split(rest)
            if any(p.startswith("--from") for p in parts):
                continue
            parts = [p for p in parts if not p.startswith("--")]
            *srcs, dest = parts
            for s in srcs:
                files.add(dest + os.path.basename(s.rstrip("/")) if dest.endswith("/") else dest)
    return Image("lifeline", files, path)


# ---------------------------------------------------------------------------------------------
# Walking the manifests


def where(file, doc):
    md = doc.get("metadata") or {}
    return f"{file}: {doc.get('kind')} {md.get('name')}"


class Pod:
    """A pod template of a workload, with what its controller adds."""

    def __init__(self, file, doc, label, template, injected, job):
        self.file, self.doc, self.label, self.template = file, doc, label, template
        self.injected = injected  # variables the operator sets in every container: {name: value}
        self.job = job            # what the formation check needs: {"kind", "nodes", ...}

    @property
    def spec(self):
        return self.template.get("spec") or {}

    @property
    def labels(self):
        return (self.template.get("metadata") or {}).get("labels") or {}

    def containers(self):
        return self.spec.get("containers") or []

    def volume(self, name):
        for v in self.spec.get("volumes") or []:
            if v.get("name") == name:
                return v
        return None


def pytorchjob_env(doc):
    """The variables training-operator v1.9 gives every container of an elastic PyTorchJob's pods
    (pkg/controller.v1/pytorch/envvar.go and elastic.go, after its defaulting): the values, or
    None for a name it sets only in some cases we do not model."""
    spec = doc.get("spec") or {}
    ep = spec.get("elasticPolicy")
    reps = spec.get("pytorchReplicaSpecs") or {}
    workers = (reps.get("Worker") or {}).get("replicas", 1)
    env = {"PYTHONUNBUFFERED": "1"}
    if "Master" in reps:
        env["PET_MASTER_ADDR"] = env["MASTER_ADDR"] = f"{doc['metadata']['name']}-master-0"
        env["PET_MASTER_PORT"] = env["MASTER_PORT"] = None
        env["WORLD_SIZE"] = env["RANK"] = env["PET_NODE_RANK"] = None
    nproc = spec.get("nprocPerNode")
    if nproc is None and (ep is None or ep.get("nProcPerNode") is None):
        nproc = "auto"  # the operator's default
    if nproc is not None:
        env["PET_NPROC_PER_NODE"] = str(nproc)
    if ep is None:
        env["PET_NNODES"] = str(sum((r or {}).get("replicas", 1) for r in reps.values()))
        return env
    host = ep.get("rdzvHost", f"{doc['metadata']['name']}-worker-0")
    port = ep.get("rdzvPort", 23456)  # else the container's pytorchjob-port, 23456 by default
    env["PET_RDZV_ENDPOINT"] = f"{host}:{port}"
    env["PET_RDZV_BACKEND"] = ep.get("rdzvBackend", "c10d")
    lo, hi = ep.get("minReplicas"), ep.get("maxReplicas")
    lo, hi = (lo if lo is not None else hi if hi is not None else workers), (
        hi if hi is not None else lo if lo is not None else workers)
    env["PET_NNODES"] = f"{lo}:{hi}"
    if ep.get("maxRestarts") is not None:
        env["PET_MAX_RESTARTS"] = str(ep["maxRestarts"])
    if ep.get("nProcPerNode") is not None:
        env["PET_NPROC_PER_NODE"] = str(ep["nProcPerNode"])
    if ep.get("rdzvId") is not None:
        env["PET_RDZV_ID"] = str(ep["rdzvId"])
    if ep.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{c.get('key')}={c.get('value')}" for c in ep["rdzvConf"])
    if ep.get("standalone"):
        env["PET_STANDALONE"] = ""
    return env


def pods(bundle):
    out = []
    for file, _, doc in bundle.docs:
        kind, spec = doc.get("kind"), doc.get("spec") or {}
        if kind == "PyTorchJob":
            injected = pytorchjob_env(doc)
            for rtype, r in (spec.get("pytorchReplicaSpecs") or {}).items():
                r = r or {}
                out.append(Pod(file, doc, f"{where(file, doc)} {rtype}", r.get("template") or {}, injected,
                               {"kind": kind, "replicas": r.get("replicas", 1), "rtype": rtype,
                                "restartPolicy": r.get("restartPolicy")}))
        elif kind == "JobSet":
            for rj in spec.get("replicatedJobs") or []:
                js = ((rj.get("template") or {}).get("spec")) or {}
                out.append(Pod(file, doc, f"{where(file, doc)} replicatedJob {rj.get('name')}",
                               js.get("template") or {}, {},
                               {"kind": kind, "replicas": rj.get("replicas", 1) * js.get("parallelism", 1),
                                "parallelism": js.get("parallelism", 1), "completions": js.get("completions"),
                                "completionMode": js.get("completionMode"), "jobs": rj.get("replicas", 1)}))
        elif kind == "StatefulSet":
            out.append(Pod(file, doc, where(file, doc), spec.get("template") or {}, {},
                           {"kind": kind, "replicas": spec.get("replicas", 1)}))
    return out


def argv_of(container):
    return [str(a) for a in (container.get("command") or [])] + [str(a) for a in (container.get("args") or [])]


def parse_help(help_text):
    """{flag: takes_value} from `run --help`."""
    flags = {}
    for line in help_text.splitlines():
        m = re.match(r"^\s+((?:-\w,)?--[\w-]+(?:,--[\w-]+)*)(?:\s+(\S+))?", line)
        if not m:
            continue
        takes = bool(m.group(2) and re.match(r"^[A-Z]+", m.group(2)))
        for name in m.group(1).split(","):
            flags[name] = takes
    return flags


class AgentCall:
    """`lifeline-agent run [options] -- command...` from a container's argv."""

    def __init__(self, argv, at):
        self.argv, self.at = argv, at
        self.options = []     # [(flag, value or None)]
        self.command = []     # after --
        self.has_separator = False

    def value(self, *names):
        for flag, v in reversed(self.options):
            if flag in names:
                return v
        return None


def agent_call(container, flags):
    argv = argv_of(container)
    idx = next((i for i, a in enumerate(argv) if os.path.basename(a) == "lifeline-agent"), None)
    if idx is None or idx + 1 >= len(argv) or argv[idx + 1] != "run":
        return None
    call = AgentCall(argv, idx)
    i = idx + 2
    while i < len(argv):
        a = argv[i]
        if a == "--":
            call.has_separator = True
            call.command = argv[i + 1:]
            break
        if a.startswith("-"):
            name, eq, v = a.partition("=")
            if not eq and flags.get(name) and i + 1 < len(argv):
                v = argv[i + 1]
                i += 1
            call.options.append((name, v if (eq or flags.get(name)) else None))
        else:
            call.command = argv[i:]
            break
        i += 1
    return call


def env_of(container):
    return {e.get("name"): e for e in container.get("env") or []}


def effective_env(pod, container):
    """name -> value (None: from the downward API) as the agent sees it."""
    env = dict(pod.injected)
    for name, e in env_of(container).items():
        env[name] = e.get("value") if "value" in e else None
    return env


def mounts(container):
    return [(m.get("mountPath", ""), m.get("name")) for m in container.get("volumeMounts") or []]


def mount_for(container, path):
    """The mount holding path (the longest mountPath that is path or a parent of it)."""
    best = None
    for mp, name in mounts(container):
        mp_n = mp.rstrip("/") or "/"
        if path == mp_n or path.startswith(mp_n.rstrip("/") + "/"):
            if best is None or len(mp_n) > len(best[0]):
                best = (mp_n, name)
    return best


def agent_containers(bundle, flags):
    for pod in pods(bundle):
        for c in pod.containers():
            call = agent_call(c, flags)
            if call is not None:
                yield pod, c, call


# ---------------------------------------------------------------------------------------------
# The checks: each returns a list of faults, "file: object: field: what is wrong"


def check_kinds(bundle, image, flags):
    errs = []
    for file, i, doc in bundle.docs:
        if not isinstance(doc, dict):
            errs.append(f"{file}: document {i}: not a mapping")
            continue
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key not in KNOWN_KINDS:
            errs.append(f"{file}: document {i}: apiVersion/kind {key[0]}/{key[1]} is not one of "
                        + ", ".join(sorted(f"{a}/{k}" for a, k in KNOWN_KINDS)))
        name = (doc.get("metadata") or {}).get("name")
        if not name or not DNS1123.match(str(name)) or len(str(name)) > 63:
            errs.append(f"{file}: document {i}: metadata.name {name!r} is not a DNS-1123 label")
    return errs


def check_fields(bundle, image, flags):
    errs = []

    def keys(obj, schema, at):
        if not isinstance(obj, dict):
            errs.append(f"{at}: not a mapping")
            return
        for k in obj:
            if k not in FIELDS[schema]:
                errs.append(f"{at}: unknown field {k!r}")

    def pod_template(t, at):
        keys(t, "pod.template", at)
        spec = t.get("spec") or {}
        keys(spec, "pod.spec", at + ".spec")
        for i, c in enumerate(spec.get("containers") or []):
            cat = f"{at}.spec.containers[{c.get('name', i)}]"
            keys(c, "container", cat)
            for p in c.get("ports") or []:
                keys(p, "container.port", cat + ".ports")
            for e in c.get("env") or []:
                keys(e, "env", cat + ".env")
            for m in c.get("volumeMounts") or []:
                keys(m, "volumeMount", cat + ".volumeMounts")
        for v in spec.get("volumes") or []:
            vat = f"{at}.spec.volumes[{v.get('name')}]"
            keys(v, "volume", vat)
            if "emptyDir" in v:
                keys(v["emptyDir"] or {}, "emptyDir", vat + ".emptyDir")

    for file, _, doc in bundle.docs:
        at, kind, spec = where(file, doc), doc.get("kind"), doc.get("spec") or {}
        if kind == "PyTorchJob":
            keys(spec, "pytorchjob.spec", at + ": spec")
            if "elasticPolicy" in spec:
                keys(spec["elasticPolicy"], "pytorchjob.elasticPolicy", at + ": spec.elasticPolicy")
                b = spec["elasticPolicy"].get("rdzvBackend")
                if b is not None and b not in RDZV_BACKENDS:
                    errs.append(f"{at}: spec.elasticPolicy.rdzvBackend {b!r} is not one of {sorted(RDZV_BACKENDS)}")
            if "runPolicy" in spec:
                keys(spec["runPolicy"], "pytorchjob.runPolicy", at + ": spec.runPolicy")
            for rtype, r in (spec.get("pytorchReplicaSpecs") or {}).items():
                rat = f"{at}: spec.pytorchReplicaSpecs.{rtype}"
                if rtype not in ("Master", "Worker"):
                    errs.append(f"{rat}: replica type {rtype!r} is not Master or Worker")
                keys(r, "pytorchjob.replicaSpec", rat)
                t = (r or {}).get("template") or {}
                pod_template(t, rat + ".template")
                names = [c.get("name") for c in (t.get("spec") or {}).get("containers") or []]
                if PYTORCHJOB_CONTAINER not in names:
                    errs.append(f"{rat}.template.spec.containers: none is named {PYTORCHJOB_CONTAINER!r} "
                                f"(the operator requires it and sets its variables there)")
        elif kind == "JobSet":
            keys(spec, "jobset.spec", at + ": spec")
            if "network" in spec:
                keys(spec["network"], "jobset.network", at + ": spec.network")
            if "failurePolicy" in spec:
                keys(spec["failurePolicy"], "jobset.failurePolicy", at + ": spec.failurePolicy")
            for rj in spec.get("replicatedJobs") or []:
                rat = f"{at}: spec.replicatedJobs[{rj.get('name')}]"
                keys(rj, "jobset.replicatedJob", rat)
                js = (rj.get("template") or {}).get("spec") or {}
                keys(js, "job.spec", rat + ".template.spec")
                pod_template(js.get("template") or {}, rat + ".template.spec.template")
                pspec = (js.get("template") or {}).get("spec") or {}
                if js.get("podFailurePolicy"):
                    if pspec.get("restartPolicy") != "Never":
                        errs.append(f"{rat}.template.spec.podFailurePolicy: needs the pods' restartPolicy Never")
                    names = {c.get("name") for c in pspec.get("containers") or []}
                    for rule in js["podFailurePolicy"].get("rules") or []:
                        cn = (rule.get("onExitCodes") or {}).get("containerName")
                        if cn is not None and cn not in names:
                            errs.append(f"{rat}.template.spec.podFailurePolicy: onExitCodes.containerName {cn!r} "
                                        f"is no container of the pod ({sorted(names)})")
        elif kind == "StatefulSet":
            keys(spec, "statefulset.spec", at + ": spec")
            pod_template(spec.get("template") or {}, at + ": spec.template")
        elif kind == "Service":
            keys(spec, "service.spec", at + ": spec")
            for p in spec.get("ports") or []:
                keys(p, "service.port", at + ": spec.ports")
        elif kind == "PersistentVolumeClaim":
            keys(spec, "pvc.spec", at + ": spec")
        elif kind == "PodMonitor":
            keys(spec, "podmonitor.spec", at + ": spec")
            for ep in spec.get("podMetricsEndpoints") or []:
                keys(ep, "podmonitor.endpoint", at + ": spec.podMetricsEndpoints")
    return errs


def check_image(bundle, image, flags):
    errs = []
    for pod in pods(bundle):
        for c in pod.containers():
            at = f"{pod.label}: container {c.get('name')}"
            img = str(c.get("image", ""))
            repo = img.split("@")[0].rsplit(":", 1)[0] if ":" in img.split("/")[-1] else img.split("@")[0]
            if repo.split("/")[-1] != image.tag_name:
                errs.append(f"{at}: image {img!r} is not the one tools/deploy/Dockerfile builds "
                            f"(…/{image.tag_name}:TAG): nothing can tell what it holds")
                continue
            argv = argv_of(c)
            if not argv:
                errs.append(f"{at}: command: none (the image's CMD is --help)")
                continue
            if image.resolve(argv[0]) is None:
                errs.append(f"{at}: command[0] {argv[0]!r} is not in the image (tools/deploy/Dockerfile installs "
                            f"no such program on PATH {':'.join(image.path)})")
            call = agent_call(c, flags)
            if call is None:
                continue
            if not call.has_separator or not call.command:
                errs.append(f"{at}: command: lifeline-agent run has no rank command after --")
                continue
            prog = call.command[0]
            if image.resolve(prog) is None:
                errs.append(f"{at}: command: the rank command {prog!r} is not in the image")
            for a in call.command[1:2]:
                if a.startswith("/") and a.endswith(".py") and a not in image.files:
                    errs.append(f"{at}: command: the script {a!r} is not in the image (no COPY puts it there)")
    return errs


def check_flags(bundle, image, flags):
    errs = []
    for pod, c, call in agent_containers(bundle, flags):
        at = f"{pod.label}: container {c.get('name')}: command"
        for flag, value in call.options:
            if flag not in flags:
                errs.append(f"{at}: lifeline-agent run has no flag {flag} (lifeline-agent run --help)")
            elif flags[flag] and value is None:
                errs.append(f"{at}: {flag} needs a value")
        cfg = call.value("--config")
        if cfg:
            m = mount_for(c, cfg)
            vol = pod.volume(m[1]) if m else None
            if not vol or "configMap" not in vol:
                errs.append(f"{at}: --config {cfg}: no ConfigMap volume is mounted there")
                continue
            cm_name = vol["configMap"].get("name")
            key = os.path.relpath(cfg, m[0])
            cm = next((d for f, _, d in bundle.docs if d.get("kind") == "ConfigMap"
                       and (d.get("metadata") or {}).get("name") == cm_name), None)
            if cm is None:
                errs.append(f"{at}: --config {cfg}: ConfigMap {cm_name!r} is not in the manifests")
                continue
            data = (cm.get("data") or {}).get(key)
            if data is None:
                errs.append(f"{at}: --config {cfg}: ConfigMap {cm_name} has no key {key!r}")
                continue
            # The agent applies its file over the scheduler's variables (agent/main.cc): a key that
            # one of the pod's PET_ variables also sets would silently undo it.
            try:
                parsed = yaml.safe_load(data) or {}
            except yaml.YAMLError:
                parsed = {}
            env = effective_env(pod, c)
            for keypath, var in CONFIG_OVER_PET:
                node = parsed
                for part in keypath.split("."):
                    node = node.get(part) if isinstance(node, dict) else None
                if node is not None and var in env:
                    errs.append(f"{at}: --config {cfg}: ConfigMap {cm_name} sets {keypath}, which overrides the "
                                f"pod's {var}")
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, key)
                with open(path, "w") as f:
                    f.write(data)
                r = subprocess.run([bundle.agent, "run", "--config", path, "--nproc", "1", "--no-python-tracing",
                                    "--run-dir", os.path.join(tmp, "run"), "--", "true"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                                   env={k: v for k, v in os.environ.items() if not k.startswith("PET_")})
                if r.returncode != 0:
                    errs.append(f"{at}: --config {cfg}: ConfigMap {cm_name} key {key}: the agent refuses it "
                                f"(exit {r.returncode}): {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")
    return errs


# Keys of the agent's YAML file (agent/config.cc) and the torchrun variable that sets the same thing.
CONFIG_OVER_PET = [("nproc", "PET_NPROC_PER_NODE"), ("rendezvous.min_nodes", "PET_NNODES"),
                   ("rendezvous.max_nodes", "PET_NNODES"), ("rendezvous.endpoint", "PET_RDZV_ENDPOINT"),
                   ("rendezvous.id", "PET_RDZV_ID"), ("restart.max_restarts", "PET_MAX_RESTARTS"),
                   ("master_addr", "PET_MASTER_ADDR"), ("master_port", "PET_MASTER_PORT")]


def pet_flag(name, flags):
    """The flag of `run --help` whose PET_ form name is (torchrun: PET_<FLAG>, dashes as _)."""
    stem = name[len("PET_"):].lower()
    for f in (f"--{stem}", "--" + stem.replace("_", "-")):
        if f in flags:
            return f
    return None


def check_env(bundle, image, flags):
    errs = []
    for pod, c, call in agent_containers(bundle, flags):
        at = f"{pod.label}: container {c.get('name')}: env"
        argv = " ".join(argv_of(c))
        used = set(re.findall(r"\$\((\w+)\)", argv))
        env = env_of(c)
        for name in sorted(used - set(env) - set(pod.injected)):
            errs.append(f"{at}: $({name}) is used in the command but not set (Kubernetes leaves it as is)")
        for name in sorted(set(env) & set(k for k, v in pod.injected.items())):
            errs.append(f"{at}: {name} is set both here and by the {pod.job['kind']} operator")
        for name, e in sorted(env.items()):
            if name in used:
                pass
            elif name.startswith("PET_"):
                if not bundle.reads_pet:
                    errs.append(f"{at}: {name}: the agent reads no PET_ variable (no \"PET_ in agent/)")
                elif name not in bundle.code_names and pet_flag(name, flags) is None:
                    errs.append(f"{at}: {name}: not read by the agent (no such name in agent/, and "
                                f"`run --help` has no flag --{name[4:].lower()})")
            elif name not in bundle.code_names:
                errs.append(f"{at}: {name}: nothing reads it (the name is nowhere in agent/ or lib/, nor used "
                            f"as $({name}) in the command)")
            src = e.get("valueFrom")
            if src is not None:
                fr = (src or {}).get("fieldRef")
                if fr is None:
                    continue
                fp = fr.get("fieldPath", "")
                ok = fp in DOWNWARD_FIELDS or re.match(r"^metadata\.(labels|annotations)\['[^']+'\]$", fp)
                if not ok:
                    errs.append(f"{at}: {name}: fieldRef {fp!r} is not a field the downward API gives")
                if fp == COMPLETION_INDEX and not (pod.job.get("kind") == "JobSet"
                                                   and pod.job.get("completionMode") == "Indexed"):
                    errs.append(f"{at}: {name}: the completion index annotation exists only in an Indexed Job "
                                f"(completionMode: Indexed)")
        for name in sorted(pod.injected):
            if name.startswith("PET_") and name not in env and bundle.reads_pet:
                if name not in bundle.code_names and pet_flag(name, flags) is None:
                    errs.append(f"{at}: {name} (set by the operator): not read by the agent")
    return errs


def parse_nodes(text):
    m = re.match(r"^(\d+)(?::(\d+))?$", str(text))
    if not m:
        return None
    lo = int(m.group(1))
    return lo, int(m.group(2)) if m.group(2) else lo


def services(bundle):
    return [(f, d) for f, _, d in bundle.docs if d.get("kind") == "Service"]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_job(bundle, image, flags):
    errs = []
    all_pods = pods(bundle)
    for pod, c, call in agent_containers(bundle, flags):
        at = f"{pod.label}: container {c.get('name')}"
        env = effective_env(pod, c)
        # Flags win over variables, as with torchrun.
        nproc = call.value("--nproc", "--nproc-per-node", "--nproc_per_node")
        nproc = nproc if nproc is not None else env.get("PET_NPROC_PER_NODE")
        if nproc is None:
            errs.append(f"{at}: ranks per node: neither --nproc nor PET_NPROC_PER_NODE (the agent would run 1)")
        elif not re.match(r"^[1-9]\d*$", str(nproc)) and str(nproc) not in ("auto", "gpu", "cpu"):
            errs.append(f"{at}: ranks per node {nproc!r} is not a number, auto, gpu or cpu")
        nnodes = call.value("--nnodes")
        nnodes = nnodes if nnodes is not None else env.get("PET_NNODES", "1")
        nodes = parse_nodes(nnodes)
        if nodes is None:
            errs.append(f"{at}: nodes {nnodes!r} is not N or MIN:MAX")
            continue
        lo, hi = nodes
        j = pod.job
        if j["kind"] == "PyTorchJob" and not lo <= j["replicas"] <= hi:
            errs.append(f"{at}: {j['rtype']} replicas {j['replicas']} outside PET_NNODES {nnodes}")
        if j["kind"] == "JobSet":
            if j.get("completions") != j.get("parallelism"):
                errs.append(f"{at}: completions {j.get('completions')} != parallelism {j.get('parallelism')}: "
                            f"not every node runs at once")
            if j["replicas"] != hi:
                errs.append(f"{at}: {j['replicas']} pods (parallelism x replicas) but PET_NNODES {nnodes}")
            if j.get("completionMode") != "Indexed" and env.get("PET_NODE_RANK", "") is None:
                errs.append(f"{at}: PET_NODE_RANK from the completion index needs completionMode: Indexed")
        if hi <= 1:
            continue
        backend = call.value("--rdzv-backend", "--rdzv_backend")
        backend = backend if backend is not None else env.get("PET_RDZV_BACKEND")
        if backend is not None and backend not in AGENT_RDZV_BACKENDS:
            errs.append(f"{at}: rendezvous backend {backend!r}: lifeline-agent meets in etcd "
                        f"({' or '.join(sorted(AGENT_RDZV_BACKENDS))}) and refuses it")
        rid = call.value("--rdzv-id", "--rdzv_id")
        if rid is None and "PET_RDZV_ID" not in env:
            errs.append(f"{at}: no rendezvous id (--rdzv-id, PET_RDZV_ID; PyTorchJob: elasticPolicy.rdzvId)")
        ep = call.value("--rdzv-endpoint", "--rdzv_endpoint")
        ep = ep if ep is not None else env.get("PET_RDZV_ENDPOINT")
        if not ep:
            errs.append(f"{at}: {hi} nodes but no rendezvous endpoint (--rdzv-endpoint, PET_RDZV_ENDPOINT)")
            continue
        host, _, port = ep.rpartition(":")
        svc_name = host.split(".")[0]
        svc = next((d for f, d in services(bundle) if (d.get("metadata") or {}).get("name") == svc_name), None)
        if svc is None:
            errs.append(f"{at}: rendezvous endpoint {ep}: no Service {svc_name!r} in the manifests (etcd.yaml)")
            continue
        sport = next((p for p in (svc.get("spec") or {}).get("ports") or [] if str(p.get("port")) == port), None)
        if sport is None:
            errs.append(f"{at}: rendezvous endpoint {ep}: Service {svc_name} has no port {port}")
            continue
        sel = (svc.get("spec") or {}).get("selector") or {}
        backends = [p for p in all_pods if selects(sel, p.labels)]
        if not backends:
            errs.append(f"{at}: rendezvous endpoint {ep}: Service {svc_name} selects no pod of the manifests")
            continue
        target = sport.get("targetPort", sport.get("port"))
        found = False
        for bp in backends:
            for bc in bp.containers():
                for cp in bc.get("ports") or []:
                    if str(target) in (str(cp.get("name")), str(cp.get("containerPort"))):
                        found = True
                        bargv = " ".join(argv_of(bc))
                        lc = re.search(r"--listen-client-urls[= ](\S+)", bargv)
                        urls = lc.group(1).split(",") if lc else []
                        if not any(re.match(rf"^https?://(0\.0\.0\.0|\[::\]|\$\(POD_IP\)):{cp.get('containerPort')}$", u)
                                   for u in urls):
                            errs.append(f"{at}: rendezvous endpoint {ep}: {bp.label}: container {bc.get('name')} "
                                        f"does not listen for clients on port {cp.get('containerPort')} of all "
                                        f"addresses (--listen-client-urls {','.join(urls) or 'unset'})")
                        if "etcd" not in os.path.basename(argv_of(bc)[0] if argv_of(bc) else ""):
                            errs.append(f"{at}: rendezvous endpoint {ep}: {bp.label} does not run etcd")
        if not found:
            errs.append(f"{at}: rendezvous endpoint {ep}: Service {svc_name} port {port} targets {target!r}, no "
                        f"container port of the pods it selects")
    return errs


def check_monitor(bundle, image, flags):
    errs = []
    agents = list(agent_containers(bundle, flags))
    for file, _, doc in bundle.docs:
        if doc.get("kind") != "PodMonitor":
            continue
        at = where(file, doc)
        spec = doc.get("spec") or {}
        sel = ((spec.get("selector") or {}).get("matchLabels")) or {}
        picked = [(p, c, call) for p, c, call in agents if selects(sel, p.labels)]
        for p, c, call in agents:
            if call.value("--metrics-addr") and not selects(sel, p.labels):
                errs.append(f"{at}: spec.selector.matchLabels {sel} does not select {p.label} "
                            f"(its labels: {p.labels})")
        if not picked:
            errs.append(f"{at}: spec.selector.matchLabels {sel} selects no training pod")
        jl = spec.get("jobLabel")
        for p, c, call in picked:
            if jl and jl not in p.labels:
                errs.append(f"{at}: spec.jobLabel {jl!r}: {p.label} has no such label")
            addr = call.value("--metrics-addr")
            if not addr:
                errs.append(f"{at}: {p.label}: the agent serves no metrics (no --metrics-addr)")
                continue
            host, _, mport = addr.rpartition(":")
            if host not in ("", "0.0.0.0", "[::]", "::", "$(POD_IP)"):
                errs.append(f"{at}: {p.label}: --metrics-addr {addr} is not reachable from Prometheus "
                            f"(serve on 0.0.0.0)")
            for ep in spec.get("podMetricsEndpoints") or []:
                name = ep.get("port")
                ports = {str(cp.get("name")): cp for cp in c.get("ports") or []}
                if name not in ports:
                    errs.append(f"{at}: spec.podMetricsEndpoints.port {name!r} is no port of {p.label} "
                                f"container {c.get('name')} (its ports: {sorted(ports)})")
                elif str(ports[name].get("containerPort")) != mport:
                    errs.append(f"{at}: port {name} of {p.label} is {ports[name].get('containerPort')}, the agent "
                                f"serves metrics on {mport}")
                if ep.get("path", "/metrics") != "/metrics":
                    errs.append(f"{at}: spec.podMetricsEndpoints.path {ep.get('path')!r}: the agent serves /metrics")
    if not any(d.get("kind") == "PodMonitor" for _, _, d in bundle.docs):
        errs.append("tools/deploy/kubernetes: no PodMonitor")
    return errs


def check_tier(bundle, image, flags):
    errs = []
    for pod, c, call in agent_containers(bundle, flags):
        at = f"{pod.label}: container {c.get('name')}"
        tier = effective_env(pod, c).get("LIFELINE_MEMORY_TIER_DIR") or "/dev/shm"
        tier = tier.rstrip("/") or "/"
        m = next(((mp, n) for mp, n in mounts(c) if (mp.rstrip("/") or "/") == tier), None)
        if m is None:
            errs.append(f"{at}: the memory tier {tier} (LIFELINE_MEMORY_TIER_DIR, else /dev/shm) is not a mount "
                        f"(volumeMounts: {[mp for mp, _ in mounts(c)]})")
            continue
        vol = pod.volume(m[1])
        ed = (vol or {}).get("emptyDir")
        if ed is None or (ed or {}).get("medium") != "Memory":
            errs.append(f"{at}: volume {m[1]!r} mounted at the memory tier {tier} is not an emptyDir of medium Memory")
        elif not ed.get("sizeLimit"):
            errs.append(f"{at}: volume {m[1]!r} (the memory tier) has no sizeLimit")
    return errs


def check_storage(bundle, image, flags):
    errs = []
    pvcs = {(d.get("metadata") or {}).get("name"): d for _, _, d in bundle.docs
            if d.get("kind") == "PersistentVolumeClaim"}
    for pod, c, call in agent_containers(bundle, flags):
        at = f"{pod.label}: container {c.get('name')}"
        ckpt = call.value("--checkpoint-dir")
        if not ckpt:
            errs.append(f"{at}: no --checkpoint-dir (every node must resume from the same step)")
            continue
        m = mount_for(c, ckpt.rstrip("/"))
        vol = pod.volume(m[1]) if m else None
        if vol is None or "persistentVolumeClaim" not in vol:
            errs.append(f"{at}: --checkpoint-dir {ckpt} is on no PersistentVolumeClaim mount "
                        f"(volumeMounts: {[mp for mp, _ in mounts(c)]})")
        else:
            claim = vol["persistentVolumeClaim"].get("claimName")
            pvc = pvcs.get(claim)
            if pvc is None:
                errs.append(f"{at}: --checkpoint-dir {ckpt}: claim {claim!r} is not in the manifests")
            elif "ReadWriteMany" not in ((pvc.get("spec") or {}).get("accessModes") or []):
                errs.append(f"{at}: --checkpoint-dir {ckpt}: claim {claim} is not ReadWriteMany (every node "
                            f"mounts it)")
        log = call.value("--events-log")
        if log:
            parent = os.path.dirname(log)
            if not any((mp.rstrip("/") or "/") == parent for mp, _ in mounts(c)):
                errs.append(f"{at}: --events-log {log}: its directory {parent} is not a mount (the agent creates "
                            f"no directory)")
        script_dir = None
        for i, a in enumerate(call.command):
            if a.startswith("--dir="):
                script_dir = a.split("=", 1)[1]
            elif a == "--dir" and i + 1 < len(call.command):
                script_dir = call.command[i + 1]
        if script_dir is not None and script_dir.rstrip("/") != ckpt.rstrip("/"):
            errs.append(f"{at}: the script saves into --dir {script_dir}, the agent resumes from "
                        f"--checkpoint-dir {ckpt}")
    return errs


CHECKS = [("kinds", check_kinds), ("fields", check_fields), ("image", check_image), ("flags", check_flags),
          ("env", check_env), ("job", check_job), ("monitor", check_monitor), ("tier", check_tier),
          ("storage", check_storage)]


def run_checks(bundle):
    """{check name: [faults]}"""
    try:
        image = parse_dockerfile(bundle.dockerfile, bundle.scripts)
    except ValueError as e:
        return {"image": [str(e)]}
    flags = parse_help(bundle.help_text)
    return {name: fn(bundle, image, flags) for name, fn in CHECKS}


# ---------------------------------------------------------------------------------------------
# The self-test: one break at a time, in a copy


def doc(bundle, kind, name=None):
    for _, _, d in bundle.docs:
        if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name):
            return d
    raise KeyError(kind)


def pj_container(b):
    return doc(b, "PyTorchJob")["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def js_job(b):
    return doc(b, "JobSet")["spec"]["replicatedJobs"][0]["template"]["spec"]


def js_container(b):
    return js_job(b)["template"]["spec"]["containers"][0]


def replace_arg(c, prefix, new):
    c["command"] = [new if a.startswith(prefix) else a for a in c["command"]]


def set_env(c, name, value):
    c["env"] = [e for e in c["env"] if e["name"] != name] + ([{"name": name, "value": value}] if value else [])


def volume(c_pod_spec, name):
    return next(v for v in c_pod_spec["volumes"] if v["name"] == name)


BREAKS = [
    # (what, the check that must fail, a word its fault must hold, the break)
    ("an unknown apiVersion", "kinds", "kubeflow.org/v2",
     lambda b: doc(b, "PyTorchJob").update(apiVersion="kubeflow.org/v2")),
    ("a misspelt elasticPolicy field", "fields", "rdzvHots",
     lambda b: doc(b, "PyTorchJob")["spec"]["elasticPolicy"].update(rdzvHots="x")),
    ("a misspelt container field", "fields", "volumeMount",
     lambda b: js_container(b).update(volumeMount=[])),
    ("the JobSet's container renamed under its podFailurePolicy", "fields", "containerName",
     lambda b: js_container(b).update(name="trainer")),
    ("the PyTorchJob container renamed", "fields", "pytorch",
     lambda b: pj_container(b).update(name="trainer")),
    ("a command[0] the image lacks", "image", "torchrun2",
     lambda b: pj_container(b)["command"].__setitem__(0, "torchrun2")),
    ("etcd-server left out of the image", "image", "'etcd'",
     lambda b: setattr(b, "dockerfile", b.dockerfile.replace(" etcd-server", ""))),
    ("a script the image lacks", "image", "/workspace/train.py",
     lambda b: replace_arg(js_container(b), "/workspace/", "/workspace/train.py")),
    ("an image the Dockerfile does not build", "image", "quay.io/coreos/etcd",
     lambda b: doc(b, "StatefulSet")["spec"]["template"]["spec"]["containers"][0].update(
         image="quay.io/coreos/etcd:v3.5.17")),
    ("a flag the agent does not have", "flags", "--no-such-flag",
     lambda b: pj_container(b)["command"].insert(2, "--no-such-flag=1")),
    ("a config file the agent refuses", "flags", "refuses",
     lambda b: doc(b, "ConfigMap")["data"].update({"agent.yaml": "hang_timeout: 5\n"})),
    ("a config file undoing PET_NPROC_PER_NODE", "flags", "overrides the pod's PET_NPROC_PER_NODE",
     lambda b: doc(b, "ConfigMap")["data"].update({"agent.yaml": "nproc: 1\nrendezvous: {last_call_seconds: 60}\n"})),
    ("a config file that is not mounted", "flags", "ConfigMap",
     lambda b: replace_arg(pj_container(b), "--config=", "--config=/etc/other/agent.yaml")),
    ("a variable nothing reads", "env", "LIFELINE_NO_SUCH_THING",
     lambda b: set_env(js_container(b), "LIFELINE_NO_SUCH_THING", "1")),
    ("$(POD_IP) not set", "env", "POD_IP",
     lambda b: js_container(b).update(env=[e for e in js_container(b)["env"] if e["name"] != "POD_IP"])),
    ("a variable the operator sets, set again", "env", "PET_NNODES",
     lambda b: set_env(pj_container(b), "PET_NNODES", "2")),
    ("the completion index outside an Indexed Job", "env", "Indexed",
     lambda b: js_job(b).pop("completionMode")),
    ("an agent that reads no PET_ variable", "env", "reads no PET_",
     lambda b: setattr(b, "reads_pet", False)),
    ("more Worker replicas than maxReplicas", "job", "outside PET_NNODES",
     lambda b: doc(b, "PyTorchJob")["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=3)),
    ("the etcd Service selecting no pod", "job", "selects no pod",
     lambda b: doc(b, "Service", "lifeline-etcd")["spec"].update(selector={"app": "etcd"})),
    ("the rendezvous on another port", "job", "no port 2380",
     lambda b: doc(b, "PyTorchJob")["spec"]["elasticPolicy"].update(rdzvPort=2380)),
    ("the rendezvous on another host", "job", "no Service",
     lambda b: set_env(js_container(b), "PET_RDZV_ENDPOINT", "etcd-elsewhere:2379")),
    ("the c10d backend", "job", "c10d",
     lambda b: doc(b, "PyTorchJob")["spec"]["elasticPolicy"].update(rdzvBackend="c10d")),
    ("no rendezvous id", "job", "rendezvous id",
     lambda b: doc(b, "PyTorchJob")["spec"]["elasticPolicy"].pop("rdzvId")),
    ("ranks per node not a number", "job", "'two'",
     lambda b: doc(b, "PyTorchJob")["spec"].update(nprocPerNode="two")),
    ("more pods than PET_NNODES", "job", "PET_NNODES",
     lambda b: js_job(b).update(parallelism=3, completions=3)),
    ("etcd listening on loopback only", "job", "listen",
     lambda b: replace_arg(doc(b, "StatefulSet")["spec"]["template"]["spec"]["containers"][0],
                           "--listen-client-urls=", "--listen-client-urls=http://127.0.0.1:2379")),
    ("the PodMonitor's port renamed", "monitor", "metrics-port",
     lambda b: doc(b, "PodMonitor")["spec"]["podMetricsEndpoints"][0].update(port="metrics-port")),
    ("the PodMonitor selecting another label", "monitor", "selects no training pod",
     lambda b: doc(b, "PodMonitor")["spec"]["selector"].update(matchLabels={"app": "other"})),
    ("metrics on loopback", "monitor", "127.0.0.1",
     lambda b: replace_arg(js_container(b), "--metrics-addr=", "--metrics-addr=127.0.0.1:9464")),
    ("the metrics port number changed", "monitor", "9465",
     lambda b: pj_container(b)["ports"][0].update(containerPort=9465)),
    ("the memory tier mounted elsewhere", "tier", "/lifeline/memory-tier",
     lambda b: pj_container(b)["volumeMounts"][1].update(mountPath="/lifeline/tier")),
    ("the memory tier on disk", "tier", "medium Memory",
     lambda b: volume(js_job(b)["template"]["spec"], "memory-tier")["emptyDir"].pop("medium")),
    ("the memory tier without a size limit", "tier", "sizeLimit",
     lambda b: volume(js_job(b)["template"]["spec"], "memory-tier")["emptyDir"].pop("sizeLimit")),
    ("the checkpoint volume mounted elsewhere", "storage", "PersistentVolumeClaim",
     lambda b: js_container(b)["volumeMounts"][0].update(mountPath="/ckpt")),
    ("the checkpoint claim ReadWriteOnce", "storage", "ReadWriteMany",
     lambda b: doc(b, "PersistentVolumeClaim")["spec"].update(accessModes=["ReadWriteOnce"])),
    ("the script saving elsewhere", "storage", "--dir",
     lambda b: replace_arg(pj_container(b), "--dir=", "--dir=/checkpoints/other")),
]


def self_test(bundle):
    base = run_checks(bundle)
    bad = {k: v for k, v in base.items() if v}
    if bad:
        print("self-test: the manifests themselves fail, so no break can be told apart:")
        for k, v in bad.items():
            for e in v:
                print(f"  [{k}] {e}")
        return 1
    failures = 0
    for what, check, word, brk in BREAKS:
        b = copy.deepcopy(bundle)
        try:
            brk(b)
        except (KeyError, IndexError, StopIteration) as e:
            print(f"FAIL {what}: the break does not apply to these manifests ({e!r})")
            failures += 1
            continue
        faults = run_checks(b).get(check, [])
        if any(word in f for f in faults):
            print(f"ok   {what}: [{check}] {next(f for f in faults if word in f)}")
        else:
            print(f"FAIL {what}: check {check} did not catch it (faults: {faults})")
            failures += 1
    print(f"self-test: {len(BREAKS) - failures} of {len(BREAKS)} breaks caught")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                    "..", "..")))
    ap.add_argument("--agent", required=True, help="the lifeline-agent binary (its `run --help`)")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    bundle = load_bundle(a.root, a.agent)
    if a.self_test:
        return self_test(bundle)
    results = run_checks(bundle)
    total = 0
    for name, _ in CHECKS:
        faults = results.get(name, [])
        total += len(faults)
        print(f"{'FAIL' if faults else 'ok  '} {name}")
        for f in faults:
            print(f"     {f}")
    files = sorted({f for f, _, _ in bundle.docs})
    print(f"{len(bundle.docs)} documents in {len(files)} files: {', '.join(files)}; "
          f"{'all checks pass' if not total else f'{total} fault(s)'}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
