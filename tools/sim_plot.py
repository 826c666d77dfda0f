#!/usr/bin/python3
"""Plots lifeline-sim's JSON report: accuracy and detection latency by fault kind.

Usage: tools/sim_plot.py REPORT.json OUT.png

Left: the share of drills of each kind whose culprits were named with the right kind, and nothing
else named (the issue's goal, 0.99, drawn as a line). Right: detection latency per fault kind,
p50 as a bar, p90/p99 as marks and max as a cross (seconds), with the hang goal (timeout + 2 s) as a line.
A report of `--signals` drills (the cross-rank checks) shows their four kinds, with the job's layout
and the replica digests' hold in the title instead.
Uses Debian's python3-matplotlib (Agg, no display).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = ["hang", "crash", "node_loss", "straggler", "slow_link", "two_at_once",
         "norm_differs", "digest_differs", "nan_loss", "loss_spike"]


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        report = json.load(f)
    by_kind = report.get("by_kind", {})
    fig, (acc_ax, lat_ax) = plt.subplots(1, 2, figsize=(12, 4.8))

    kinds = [k for k in KINDS if by_kind.get(k, {}).get("drills", 0) > 0]
    accuracy = [by_kind[k]["accuracy"] for k in kinds]
    bars = acc_ax.bar(kinds, accuracy, color=["#4c72b0" if a >= 0.99 else "#c44e52" for a in accuracy])
    for bar, k in zip(bars, kinds):
        t = by_kind[k]
        acc_ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.01, f"{t['correct']}/{t['drills']}",
                    ha="center", va="bottom", fontsize=8)
    acc_ax.axhline(0.99, color="grey", linestyle="--", linewidth=1, label="goal 0.99")
    acc_ax.set_ylim(0, 1.1)
    acc_ax.set_ylabel("accuracy (culprits and kind right, nothing else named)")
    acc_ax.set_title(f"accuracy {report['accuracy']:.3f} over {report['drills']} drills; "
                     f"false alarms {report['false_alarms']} ({report['clean_runs']} clean runs)", fontsize=9)
    acc_ax.legend(loc="lower right", fontsize=8)
    acc_ax.tick_params(axis="x", labelrotation=20, labelsize=8)

    lat_kinds = [k for k in KINDS if isinstance(by_kind.get(k, {}).get("latency_seconds"), dict)]
    xs = list(range(len(lat_kinds)))
    p50 = [by_kind[k]["latency_seconds"]["p50"] for k in lat_kinds]
    lat_ax.bar(xs, p50, color="#55a868", label="p50")
    for marker, key, label in (("_", "p90", "p90"), ("v", "p99", "p99"), ("x", "max", "max")):
        lat_ax.scatter(xs, [by_kind[k]["latency_seconds"][key] for k in lat_kinds], marker=marker, color="black",
                       s=60 if marker == "_" else 25, label=label, zorder=3)
    for x, k in zip(xs, lat_kinds):
        lat_ax.text(x, p50[x] + 0.1, f"{p50[x]:.2f} s\nn={by_kind[k]['latency_seconds']['count']}", ha="center",
                    va="bottom", fontsize=7)
    cfg = report.get("config", {})
    signals = cfg.get("signals")
    goal = None if signals else report.get("goals", {}).get("hang_latency_at_most_seconds")
    top = max([by_kind[k]["latency_seconds"]["max"] for k in lat_kinds] + [goal or 0, 0.1])
    lat_ax.set_ylim(0, top * 1.25)
    if goal:
        lat_ax.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"hang goal {goal:g} s")
    lat_ax.set_xticks(xs)
    lat_ax.set_xticklabels(lat_kinds, rotation=20, fontsize=8)
    lat_ax.set_ylabel("detection latency (s) from the fault's onset")
    lease = cfg.get("rendezvous", {}).get("lease_seconds")
    timeout = cfg.get("hang", {}).get("floor_seconds")
    if signals:
        layout = signals["layout"]
        lat_ax.set_title(f"latency by kind (TP {layout['tp']} x PP {layout['pp']} x DP {layout['dp']}, "
                         f"{signals['ranks_per_node']} ranks a node, digest hold {signals['digest_hold_seconds']:g} s)",
                         fontsize=9)
    else:
        lat_ax.set_title(f"latency by fault kind (hang timeout {timeout:g} s, lease {lease:g} s)", fontsize=9)
    lat_ax.legend(loc="upper left", fontsize=7, ncol=5)

    fig.suptitle(f"lifeline-sim: {report['ranks']} ranks on {report['nodes']} nodes, seed {report['seed']}",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
