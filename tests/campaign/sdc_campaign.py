#!/usr/bin/env python3
"""Silent faults injected into real torch jobs under lifeline-agent, and what the agent made of them.

    sdc_campaign.py --agent AGENT --python PYTHON --pythonpath DIR [--faults N] [--clean C]
                    [--seed S] [--jobs J] [--json FILE] [--markdown FILE] [--keep DIR] [--slice]
                    [--classes PARALLEL:CLASS,...] [--nproc R] [--sdc-policy P] [--rescore DIR]

Each run is one job of tests/campaign/sdc_job.py under lifeline-agent: DDP (2-4 replicas) or FSDP2
(2-3 shards) over gloo, Adam, 50 steps of a small MLP, a checkpoint every 5 steps. C clean jobs,
each with its own seed, and N faulty ones, each reusing the seed of a clean job of its kind, so
that its final parameters can be held against that clean run's. The faults are drawn from the seed,
every class of sdc_job.py in turn (tests/campaign/sdc_job.py says what each does): a random step,
rank, tensor, element and (mantissa) bit.

A run's outcome is read only from what the agent wrote: its events log (anomalies, rollbacks,
restarts, the finish), the suspect markers in the checkpoint directory, and the final state the
ranks wrote at their end. The injection (class, step, rank) is used only to score it:

  detected      an anomaly of kind non_finite, spike, disagreement or sdc_suspect at or after the
                injection step; the detector is the kind of the first one
  rank named    one of those anomalies names the injected rank alone (a spike of the all-reduced
                gradient norm names every rank; the loss's names the rank it came from)
  steps until   its step minus the injection step
  steps lost    steps trained again: each rollback's steps_rolled_back, each other restart's
                steps_redone (the agent's accounts), plus the steps skipped
  finished      the agent's `finished` record and exit 0
  good weights  the final parameters and Adam state equal, bit for bit, the clean run's (where no
                step was skipped; a skipped step makes a different run)
  false alarm   any such anomaly in a clean run, or before the injection step in a faulty one

The agent runs with its defaults (every policy: non_finite, spike and sdc_suspect roll back)
except: training_signals.warmup_steps 10 (the jobs are 50 steps long; the default is 50), and
restart.max_restarts 4 (one more than the default: the rollback policy's own give-up ends a job,
not the restart budget). --sdc-policy sets policy.sdc_suspect otherwise (restart, log).

--keep DIR keeps every run's directory (events log, agent's stderr, checkpoints, final states);
--rescore DIR scores such a directory again without running anything.

--slice runs the ctest slice: two clean jobs and one fault of each of four detectable classes with
a fixed seed, and asserts that each fault is detected by a detector that can see it (naming its
rank, and ending on the clean run's weights, where SLICE_EXPECT says so), that every job finishes
and that the clean jobs raise nothing. Prints a line per run and the table; exits 1 on a failed
assertion.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = 50
CKPT_EVERY = 5
WARMUP = 10
PAUSE = 0.02            # seconds slept after each step: a step of ~30 ms instead of ~8 ms
FIRST_FAULT_STEP = 15   # after the warm-up, so that a spike can be judged
LAST_FAULT_STEP = 44    # a snapshot at 45 and 50 still follows
SIGNAL_KINDS = ("non_finite", "spike", "disagreement", "sdc_suspect")
EXPONENT_BIT = 30       # the exponent's top bit: a value below 2 in magnitude is scaled by 2^128

CLASSES = {
    "ddp": ["param_exponent", "param_mantissa", "grad_pre_exponent", "grad_pre_mantissa",
            "grad_post_exponent", "grad_post_mantissa", "adam_m_exponent", "adam_v_exponent",
            "adam_mantissa", "poisoned_batch", "nan_loss"],
    # FSDP2 has no all-reduce of gradients to flip a bit before: a rank's unsharded gradient goes
    # into a reduce-scatter, and what it carries lands in the owning rank's shard, as a flip after
    # the reduce-scatter (grad_post_*) does.
    "fsdp2": ["param_exponent", "param_mantissa", "grad_post_exponent", "grad_post_mantissa",
              "adam_m_exponent", "adam_v_exponent", "adam_mantissa", "poisoned_batch", "nan_loss"],
}

# What each class can be seen by, by construction, and why not where it cannot. Used for the
# report, and by --slice to know which classes it must see detected.
VISIBLE = {
    ("ddp", "param_exponent"): "spike/non_finite (loss on the rank, then every norm) and sdc_suspect",
    ("ddp", "param_mantissa"): "sdc_suspect at the next snapshot only: the loss moves by far less than its noise",
    ("ddp", "grad_pre_exponent"): "spike/non_finite of the norm; never sdc_suspect: the all-reduce hands every "
                                  "replica the same corrupted sum",
    ("ddp", "grad_pre_mantissa"): "nothing: every replica receives the same slightly wrong sum, so replicas and "
                                  "norms stay identical and the change is below the noise",
    ("ddp", "grad_post_exponent"): "non_finite/spike/disagreement of the norm on that rank, sdc_suspect",
    ("ddp", "grad_post_mantissa"): "disagreement of the norm when the flip reaches its bits, sdc_suspect when the "
                                   "update or Adam's state keeps it",
    ("ddp", "adam_m_exponent"): "spike of the loss after the update explodes one parameter, sdc_suspect",
    ("ddp", "adam_v_exponent"): "sdc_suspect only: a huge exp_avg_sq shrinks one element's update to ~0",
    ("ddp", "adam_mantissa"): "sdc_suspect at the next snapshot only",
    ("ddp", "poisoned_batch"): "spike of the loss (that rank) and of the norm",
    ("ddp", "nan_loss"): "non_finite naming the rank",
    ("fsdp2", "param_exponent"): "spike/non_finite: every rank computes with the gathered, corrupted parameter",
    ("fsdp2", "param_mantissa"): "nothing: a shard has no replica to compare with, and the loss does not move",
    ("fsdp2", "grad_post_exponent"): "spike/non_finite of the norm (all-reduced: the same on every rank)",
    ("fsdp2", "grad_post_mantissa"): "nothing: no replica, and the global norm is all-reduced, identical "
                                     "on every rank",
    ("fsdp2", "adam_m_exponent"): "spike of the loss after the update",
    ("fsdp2", "adam_v_exponent"): "nothing: the element's update shrinks to ~0, and no replica holds it",
    ("fsdp2", "adam_mantissa"): "nothing: no replica to compare with",
    ("fsdp2", "poisoned_batch"): "spike of the loss (that rank) and of the norm",
    ("fsdp2", "nan_loss"): "non_finite naming the rank",
}
UNDETECTABLE = {("ddp", "grad_pre_mantissa"), ("fsdp2", "param_mantissa"), ("fsdp2", "grad_post_mantissa"),
                ("fsdp2", "adam_v_exponent"), ("fsdp2", "adam_mantissa")}

def agent_config(sdc_policy=None):
    policy = f"policy:\n  sdc_suspect: {sdc_policy}\n" if sdc_policy else ""
    return f"""training_signals:
  warmup_steps: {WARMUP}
{policy}restart:
  max_restarts: 4
"""

SLICE_SEED = 5301
SLICE = [("ddp", "nan_loss"), ("ddp", "param_mantissa"), ("ddp", "grad_post_exponent"),
         ("fsdp2", "poisoned_batch")]
# What the slice asserts of each of its faults beyond "detected and finished": the detectors that
# may see it first, whether one must name the injected rank alone, and whether the job must end on
# the clean run's very weights (a rollback to a checkpoint before the fault replays it exactly).
SLICE_EXPECT = {
    ("ddp", "nan_loss"): ({"non_finite"}, True, True),
    ("ddp", "param_mantissa"): ({"sdc_suspect"}, False, None),  # 2 replicas: no majority, both named
    ("ddp", "grad_post_exponent"): ({"non_finite", "spike", "disagreement"}, True, True),
    ("fsdp2", "poisoned_batch"): ({"spike"}, True, None),
}


class Job:
    def __init__(self, name, parallel, nproc, seed, fault=None, reference=None):
        self.name, self.parallel, self.nproc, self.seed = name, parallel, nproc, seed
        self.fault, self.reference = fault, reference  # reference: the clean Job of the same seed
        self.out = None
        self.result = None

    def spec(self):
        return {"parallel": self.parallel, "steps": STEPS, "ckpt_every": CKPT_EVERY, "seed": self.seed,
                "pause": PAUSE, "fault": self.fault}

    def label(self):
        if not self.fault:
            return f"{self.name} clean {self.parallel} x{self.nproc} seed {self.seed}"
        f = self.fault
        return (f"{self.name} {self.parallel} x{self.nproc} seed {self.seed} {f['class']} rank {f['rank']} "
                f"step {f['step']} bit {f['bit']}")


def layouts(clean):
    """(parallel, ranks) of each clean job: two DDP for one FSDP2; DDP mostly on 3 ranks (a
    majority to name a rank), some on 2 and 4; FSDP2 on 2 ranks, every fourth on 3."""
    out = []
    for i in range(clean):
        if i % 3 == 2:
            out.append(("fsdp2", 3 if (i // 3) % 4 == 3 else 2))
        else:
            out.append(("ddp", (3, 2, 3, 4)[(i // 3) % 4] if i % 3 == 0 else 3))
    return out


def plan(faults, clean, seed, classes=None):
    """The jobs: `clean` clean ones (a list of (parallel, ranks), or a count for layouts()) and
    `faults` faulty ones, every class in turn (or those of `classes`, a list of (parallel, class)),
    each on the seed of a clean job of its kind."""
    rnd = random.Random(seed)
    cleans = []
    for i, (parallel, nproc) in enumerate(layouts(clean) if isinstance(clean, int) else clean):
        cleans.append(Job(f"c{i:03d}", parallel, nproc, seed * 1000 + i))
    rows = classes or [(p, c) for p in ("ddp", "fsdp2") for c in CLASSES[p]]
    jobs = []
    for i in range(faults):
        parallel, cls = rows[i % len(rows)]
        pool = [c for c in cleans if c.parallel == parallel] or cleans
        ref = pool[(i // len(rows)) % len(pool)] if classes else rnd.choice(pool)
        if "exponent" in cls:
            bit = EXPONENT_BIT
        elif "mantissa" in cls:
            bit = rnd.randrange(0, 23)
        else:
            bit = None
        fault = {"class": cls, "step": rnd.randint(FIRST_FAULT_STEP, LAST_FAULT_STEP),
                 "rank": rnd.randrange(ref.nproc), "bit": bit, "u": [rnd.random(), rnd.random()]}
        jobs.append(Job(f"f{i:03d}", parallel, ref.nproc, ref.seed, fault, ref))
    return cleans, jobs


def _lines(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def run_job(job, agent, python, pythonpath, base, script, config):
    out = os.path.join(base, job.name)
    os.makedirs(out)
    job.out = out
    cfg = os.path.join(out, "agent.yaml")
    with open(cfg, "w") as f:
        f.write(config)
    events = os.path.join(out, "events.jsonl")
    env = dict(os.environ, PYTHONPATH=pythonpath)
    cmd = [agent, "run", "--nproc", str(job.nproc), "--master-port", "0", "--events-log", events, "--config", cfg,
           "--checkpoint-dir", os.path.join(out, "ckpt"), "--", python, script, out, json.dumps(job.spec())]
    started = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        rc, stderr = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, stderr = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else ""
    with open(os.path.join(out, "agent.stderr"), "w") as f:
        f.write(stderr or "")
    job.result = {"rc": rc, "seconds": round(time.monotonic() - started, 2), "events": _lines(events)}
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump({"rc": rc, "seconds": job.result["seconds"], "spec": job.spec(), "nproc": job.nproc}, f)
    return job


def reload_job(job, base):
    """The result of `job` as a kept campaign directory holds it (--rescore)."""
    job.out = os.path.join(base, job.name)
    with open(os.path.join(job.out, "run.json")) as f:
        run = json.load(f)
    job.result = {"rc": run["rc"], "seconds": run["seconds"], "events": _lines(os.path.join(job.out, "events.jsonl"))}
    return job


def _final_state(job):
    """{rank: result dict} of the newest launch that wrote results, with its restart number."""
    if not job.out:
        return None, {}
    best = {}
    for name in os.listdir(job.out):
        if name.startswith("result.") and name.endswith(".json"):
            _, restart, rank, _ = name.split(".")
            best.setdefault(int(restart), {})[int(rank)] = os.path.join(job.out, name)
    if not best:
        return None, {}
    restart = max(best)
    res = {}
    for rank, path in best[restart].items():
        with open(path) as f:
            res[rank] = json.load(f)
    return restart, res


def _max_param_difference(job, restart, ref_restart):
    try:
        import torch
    except ImportError:
        return None
    worst = 0.0
    for rank in range(job.nproc):
        a = os.path.join(job.out, f"params.{restart}.{rank}.pt")
        b = os.path.join(job.reference.out, f"params.{ref_restart}.{rank}.pt")
        if not (os.path.exists(a) and os.path.exists(b)):
            return None
        ta, tb = torch.load(a), torch.load(b)
        if ta.shape != tb.shape:
            return None
        d = (ta.double() - tb.double()).abs()
        if not torch.isfinite(d).all():
            return float("inf")
        worst = max(worst, float(d.max()))
    return worst


def score(job):
    """What the agent's records say about one run (and, for a faulty run, against its injection)."""
    r = job.result
    ev = r["events"]
    anomalies = [e for e in ev if "kind" in e]
    signal = [e for e in anomalies if e["kind"] in SIGNAL_KINDS]
    other = [e for e in anomalies if e["kind"] not in SIGNAL_KINDS]
    finished = r["rc"] == 0 and any(e.get("action") == "finished" for e in ev)
    rollbacks = [e for e in ev if e.get("action") == "rollback"]
    restarts = [e for e in ev if e.get("action") == "restart"]
    lost = sum(int(e.get("steps_rolled_back") or 0) for e in rollbacks)
    lost += sum(int(e.get("steps_redone") or 0) for e in ev
                if e.get("action") == "time_lost" and e.get("cause") not in ("non_finite", "spike"))
    suspect_marked = sorted({e["step"] for e in ev if e.get("action") == "mark_suspect" and e.get("ok")})
    restart, final = _final_state(job)
    skipped = sorted({s for res in final.values() for s in res.get("skipped", [])})
    s = {"name": job.name, "parallel": job.parallel, "nproc": job.nproc, "seed": job.seed, "fault": job.fault,
         "rc": r["rc"], "seconds": r["seconds"], "finished": finished, "rollbacks": len(rollbacks),
         "restarts": len(restarts), "steps_lost": lost + len(skipped), "skipped": skipped,
         "suspect_marked": suspect_marked,
         "anomalies": [{"kind": e["kind"], "step": e.get("step"), "ranks": e.get("ranks"), "restart": e.get("restart")}
                       for e in anomalies],
         "other_alarms": len(other), "final_finite": bool(final) and all(v.get("finite") for v in final.values())}
    if not job.fault:
        s["false_alarms"] = len(signal)
        return s
    f = job.fault
    early = [e for e in signal if e.get("step") is not None and e["step"] < f["step"]]
    after = [e for e in signal if e not in early]
    s["false_alarms"] = len(early)
    s["detected"] = bool(after)
    s["kinds"] = sorted({e["kind"] for e in after})
    if after:
        first = after[0]
        s["detector"] = first["kind"]
        s["steps_until"] = first["step"] - f["step"]
        # Named: one of the anomalies names the injected rank alone (an all-reduced norm's spike
        # names every rank; the loss's, the rank it came from).
        s["rank_named"] = any(e.get("ranks") == [f["rank"]] for e in after)
    inject = os.path.join(job.out, f"inject.{f['rank']}.json")
    if os.path.exists(inject):
        with open(inject) as fh:
            s["injected"] = json.load(fh)  # the injector's own note: for the report, never for scoring
    good = None
    if job.reference is not None and job.reference.result is not None and final and not skipped:
        ref_restart, ref = _final_state(job.reference)
        if ref and len(ref) == len(final) == job.nproc:
            good = all(final[k]["digest"] == ref[k]["digest"] for k in final)
            s["max_param_difference"] = _max_param_difference(job, restart, ref_restart)
    s["good_weights"] = good
    return s


def _median(values):
    return statistics.median(values) if values else None


def summarize(scores):
    """Per (parallel, class) rows, and the clean runs' line."""
    rows = collections.OrderedDict()
    for p in ("ddp", "fsdp2"):
        for c in CLASSES[p]:
            rows[(p, c)] = []
    for s in scores:
        if s["fault"]:
            rows.setdefault((s["parallel"], s["fault"]["class"]), []).append(s)
    table = []
    for (p, c), runs in rows.items():
        if not runs:
            continue
        det = [s for s in runs if s["detected"]]
        checkable = [s for s in runs if s["good_weights"] is not None]
        diffs = [s["max_param_difference"] for s in runs
                 if not s["detected"] and s.get("max_param_difference") is not None]
        traceless = sum(1 for s in runs if not s["detected"] and s["good_weights"])
        table.append({
            "parallel": p, "class": c, "injected": len(runs), "detected": len(det), "missed": len(runs) - len(det),
            "by": dict(collections.Counter(s["detector"] for s in det)),
            "rank_named": sum(1 for s in det if s["rank_named"]),
            "steps_until_median": _median([s["steps_until"] for s in det]),
            "steps_until_max": max([s["steps_until"] for s in det], default=None),
            "steps_lost_median": _median([s["steps_lost"] for s in runs]),
            "steps_lost_max": max([s["steps_lost"] for s in runs], default=None),
            "finished": sum(1 for s in runs if s["finished"]),
            "good_weights": sum(1 for s in checkable if s["good_weights"]), "checkable": len(checkable),
            "missed_max_param_difference": max(diffs) if diffs else None,
            "missed_without_trace": traceless,
            "false_alarms": sum(s["false_alarms"] for s in runs),
            "other_alarms": sum(s["other_alarms"] for s in runs),
            "undetectable_by_design": (p, c) in UNDETECTABLE, "visible_to": VISIBLE.get((p, c), ""),
        })
    clean = [s for s in scores if not s["fault"]]
    clean_line = {"runs": len(clean), "steps": len(clean) * STEPS,
                  "false_alarms": sum(s["false_alarms"] for s in clean),
                  "other_alarms": sum(s["other_alarms"] for s in clean),
                  "finished": sum(1 for s in clean if s["finished"]),
                  "by_parallel": dict(collections.Counter(f"{s['parallel']} x{s['nproc']}" for s in clean))}
    return table, clean_line


def markdown(table, clean_line, meta):
    def num(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:g}"
        return str(v)

    out = ["| job | fault class | injected | detected (first detector) | missed | rank named | "
           "steps until detection (median / max) | steps lost (median / max) | finished | good weights | "
           "false alarms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in table:
        by = ", ".join(f"{k} {v}" for k, v in sorted(row["by"].items(), key=lambda kv: -kv[1]))
        missed = str(row["missed"])
        notes = []
        if row["missed_without_trace"]:
            notes.append(f"{row['missed_without_trace']} left no trace")
        if row["missed"] and row["missed_max_param_difference"]:
            notes.append(f"final params off by <= {row['missed_max_param_difference']:.2g}")
        if notes:
            missed += " (" + "; ".join(notes) + ")"
        if row["undetectable_by_design"]:
            missed += " †"
        good = f"{row['good_weights']}/{row['checkable']}" if row["checkable"] else "n/a (skipped)"
        out.append(f"| {row['parallel'].upper()} | {row['class']} | {row['injected']} | {row['detected']}"
                   f"{' (' + by + ')' if by else ''} | {missed} | {row['rank_named']}/{row['detected']} | "
                   f"{num(row['steps_until_median'])} / {num(row['steps_until_max'])} | "
                   f"{num(row['steps_lost_median'])} / {num(row['steps_lost_max'])} | "
                   f"{row['finished']}/{row['injected']} | {good} | {row['false_alarms']} |")
    tot_inj = sum(r["injected"] for r in table)
    tot_det = sum(r["detected"] for r in table)
    detectable = [r for r in table if not r["undetectable_by_design"]]
    out.append("")
    out.append(f"Faults: {tot_inj} injected, {tot_det} detected; in the classes these means can see, "
               f"{sum(r['detected'] for r in detectable)} of {sum(r['injected'] for r in detectable)}. "
               f"Clean runs: {clean_line['runs']} ({clean_line['steps']} steps; "
               f"{', '.join(f'{k}: {v}' for k, v in sorted(clean_line['by_parallel'].items()))}), "
               f"false alarms {clean_line['false_alarms']}, other anomalies {clean_line['other_alarms']}, "
               f"finished {clean_line['finished']}/{clean_line['runs']}. Other anomalies in the faulty runs: "
               f"{sum(r['other_alarms'] for r in table)}. {meta}")
    out.append("")
    for row in table:
        if row["undetectable_by_design"]:
            out.append(f"† {row['parallel'].upper()} {row['class']}: visible to {row['visible_to']}.")
    return "\n".join(out)


def campaign(agent, python, pythonpath, faults, clean, seed, jobs=1, keep=None, log=print, classes=None,
             config=None):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdc_job.py")
    cleans, faulty = plan(faults, clean, seed, classes)
    base = tempfile.mkdtemp(prefix="lifeline-sdc-campaign-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
    started = time.monotonic()
    scores = []
    try:
        # The clean runs first: each faulty run's final state is compared with its clean run's.
        for batch in (cleans, faulty):
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                futures = [pool.submit(run_job, j, agent, python, pythonpath, base, script, config or agent_config())
                           for j in batch]
                for fut in concurrent.futures.as_completed(futures):
                    j = fut.result()
                    s = score(j)
                    scores.append(s)
                    log(_one_line(j, s))
        wall = time.monotonic() - started
    finally:
        if keep:
            shutil.copytree(base, keep, dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)
    scores.sort(key=lambda s: s["name"])
    return scores, wall


def _one_line(job, s):
    kinds = ",".join(f"{a['kind']}@{a['step']}{a['ranks']}" for a in s["anomalies"]) or "-"
    tail = ""
    if job.fault:
        tail = (f" detected={s['detected']} by={s.get('detector', '-')} until={s.get('steps_until', '-')}"
                f" good={s.get('good_weights')}")
    return (f"{job.label()}: rc={s['rc']} {s['seconds']} s anomalies={kinds} rollbacks={s['rollbacks']} "
            f"restarts={s['restarts']} lost={s['steps_lost']}{tail}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", default=None)
    p.add_argument("--python", default=sys.executable, help="the ranks' interpreter, torch 2.x (default: this one)")
    p.add_argument("--pythonpath", default=None, help="where the lifeline package is (build/python-venv)")
    p.add_argument("--faults", type=int, default=100)
    p.add_argument("--clean", type=int, default=21)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--jobs", type=int, default=1, help="jobs run at once")
    p.add_argument("--json", default=None, help="write every run's score and the table here")
    p.add_argument("--markdown", default=None, help="write the table here")
    p.add_argument("--keep", default=None, help="copy every run's directory here")
    p.add_argument("--rescore", default=None, help="score the runs kept in this directory (by --keep, with the "
                   "same --seed, --faults and --clean) again instead of running them")
    p.add_argument("--slice", action="store_true", help="the ctest slice: fixed faults, asserted")
    p.add_argument("--classes", default=None, help="only these, PARALLEL:CLASS,... (one clean run of each "
                   "PARALLEL on --nproc ranks)")
    p.add_argument("--nproc", type=int, default=3, help="ranks of the jobs of --classes")
    p.add_argument("--sdc-policy", default=None, help="the agent's policy for sdc_suspect (default: the "
                   "agent's, rollback)")
    args = p.parse_args()
    if not args.rescore and not (args.agent and args.pythonpath):
        p.error("--agent and --pythonpath are needed to run jobs")
    if args.slice:
        seed = SLICE_SEED if args.seed is None else args.seed
        faults, clean, classes = len(SLICE), [("ddp", 2), ("fsdp2", 2)], SLICE
    elif args.classes:
        seed = random.randrange(1 << 31) if args.seed is None else args.seed
        classes = [tuple(c.split(":")) for c in args.classes.split(",")]
        faults, clean = args.faults, [(p, args.nproc) for p in sorted({p for p, _ in classes})]
    else:
        seed = random.randrange(1 << 31) if args.seed is None else args.seed
        faults, clean, classes = args.faults, args.clean, None
    print(f"sdc campaign: seed {seed}, {faults} faults, {clean if isinstance(clean, int) else len(clean)} clean runs, "
          f"{args.jobs} at a time", flush=True)
    if args.rescore:
        cleans, faulty = plan(faults, clean, seed, classes)
        scores = [score(reload_job(j, args.rescore)) for j in cleans + faulty]
        with open(os.path.join(args.rescore, "wall.json")) as f:
            kept = json.load(f)
        wall, args.jobs = kept["wall_seconds"], kept.get("jobs", args.jobs)
    else:
        scores, wall = campaign(args.agent, args.python, args.pythonpath, faults, clean, seed, args.jobs,
                                args.keep, classes=classes, log=lambda line: print(line, flush=True),
                                config=agent_config(args.sdc_policy))
        if args.keep:
            with open(os.path.join(args.keep, "wall.json"), "w") as f:
                json.dump({"wall_seconds": wall, "jobs": args.jobs}, f)
    table, clean_line = summarize(scores)
    meta = f"Seed {seed}, {wall:.0f} s wall, {args.jobs} job(s) at a time."
    md = markdown(table, clean_line, meta)
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "wall_seconds": round(wall, 1), "jobs": args.jobs, "steps": STEPS,
                       "ckpt_every": CKPT_EVERY, "agent_config": agent_config(args.sdc_policy), "table": table,
                       "clean": clean_line, "runs": scores}, f, indent=1)
    if not args.slice:
        return 0
    failures = []
    for s in scores:
        if not s["fault"]:
            if s["false_alarms"] or not s["finished"]:
                failures.append(f"clean run {s['name']}: anomalies {s['anomalies']}, rc {s['rc']}")
            continue
        key = (s["parallel"], s["fault"]["class"])
        if key not in UNDETECTABLE and not s["detected"]:
            failures.append(f"{s['name']} {key}: not detected; anomalies {s['anomalies']}")
        if s["false_alarms"]:
            failures.append(f"{s['name']} {key}: an alarm before the fault: {s['anomalies']}")
        if not s["finished"]:
            failures.append(f"{s['name']} {key}: the job did not finish (rc {s['rc']})")
        if key in SLICE_EXPECT and s["detected"]:
            kinds, named, good = SLICE_EXPECT[key]
            if s["detector"] not in kinds:
                failures.append(f"{s['name']} {key}: first seen by {s['detector']}, expected one of {sorted(kinds)}")
            if named and not s["rank_named"]:
                failures.append(f"{s['name']} {key}: no anomaly names rank {s['fault']['rank']} alone: "
                                f"{s['anomalies']}")
            if good and not s["good_weights"]:
                failures.append(f"{s['name']} {key}: the job did not end on the clean run's weights "
                                f"(max difference {s.get('max_param_difference')})")
    for f in failures:
        print("sdc campaign: FAILED (seed %d): %s" % (seed, f))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
