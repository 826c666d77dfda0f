#!/usr/bin/python3
"""Checks that dashboards and alert rules use only metrics lifeline-agent really exports.

Usage: check_names.py --exposition SCRAPE.txt --readme README.md FILE...

SCRAPE.txt is a Prometheus text exposition scraped from a running agent; each FILE is a Grafana
dashboard (.json) or a Prometheus rules file (.yml/.yaml). The checks:
  - every lifeline_* metric a PromQL expression uses is a family of the exposition (_bucket, _sum
    and _count name their histogram's family);
  - every lifeline_* family of the exposition appears in the README in backticks, every family of
    the README's metrics table is in the exposition, with the type the table gives;
  - a dashboard is valid JSON, has the template variables datasource (a Prometheus data source),
    job and instance, its panels query through ${datasource}, and every lifeline_* selector in a
    panel or annotation carries job=~"$job" and instance=~"$instance", so that the dashboard shows
    only what the variables select.
Each problem is printed with its file and expression; the exit status is 1 on any problem.
Standard library only (the rules files are read line by line: no PyYAML on the test machines).
"""

import argparse
import json
import re
import sys

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SUMMARY_SUFFIXES = ("_sum", "_count")
METRIC_CHARS = re.compile(r"[A-Za-z0-9_:]")
REQUIRED_MATCHERS = ('job=~"$job"', 'instance=~"$instance"')


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, message, expr=None):
        line = f"{where}: {message}"
        if expr is not None:
            line += f"\n    expr: {' '.join(expr.split())}"
        self.items.append(line)


# ------------------------------------------------------------------ exposition and README

def read_exposition(path):
    """Returns {family: type} from the '# TYPE name type' lines."""
    families = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "#" and parts[1] == "TYPE":
                families[parts[2]] = parts[3]
    return families


def read_readme(path):
    """Returns (every `identifier` in backticks, {family: type} of the metrics table rows)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    backticked = set(re.findall(r"`([A-Za-z_:][A-Za-z0-9_:]*)`", text))
    table = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*`(lifeline_[A-Za-z0-9_:]*)`\s*\|\s*([a-z]+)\s*\|", line)
        if m:
            table[m.group(1)] = m.group(2)
    return backticked, table


# ------------------------------------------------------------------ PromQL scanning

def strip_strings_and_comments(expr):
    """Blanks out string literals and # comments, keeping offsets (so the selectors stay put).

    Returns (code, strings): code with every string's contents replaced by spaces, and the list
    of (start, end, contents) of the strings, quotes included in start..end.
    """
    out = []
    strings = []
    i = 0
    n = len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                j += 2 if expr[j] == "\\" and c != "`" else 1
            j = min(j, n - 1)
            strings.append((i, j + 1, expr[i + 1:j]))
            out.append(c + " " * (j - i - 1) + (expr[j] if j > i else ""))
            i = j + 1
        elif c == "#":
            j = expr.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out), strings


def selectors(expr):
    """Yields (metric name, matcher text or None) for every lifeline_* vector selector.

    A name followed by '(' is a function call, not a metric; a name inside {...} is a label name.
    {__name__="lifeline_..."} selectors are reported too.
    """
    code, strings = strip_strings_and_comments(expr)
    depth = 0  # inside {...}
    i = 0
    n = len(code)
    while i < n:
        c = code[i]
        if c == "{":
            depth += 1
            i += 1
            continue
        if c == "}":
            depth = max(0, depth - 1)
            i += 1
            continue
        if METRIC_CHARS.match(c) and (i == 0 or not METRIC_CHARS.match(code[i - 1])):
            j = i
            while j < n and METRIC_CHARS.match(code[j]):
                j += 1
            word = code[i:j]
            k = j
            while k < n and code[k].isspace():
                k += 1
            if depth == 0 and word.startswith("lifeline_") and not (k < n and code[k] == "("):
                matchers = None
                if k < n and code[k] == "{":
                    end = code.find("}", k)
                    end = n if end < 0 else end
                    matchers = expr[k + 1:end]
                yield word, matchers
            i = j
            continue
        i += 1
    for start, end, contents in strings:
        before = code[:start].rstrip()
        if re.search(r"__name__\s*=\s*$", before) and contents.startswith("lifeline_"):
            yield contents, None


def family_of(name, families):
    if name in families:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and families.get(base) == "histogram":
            return base
    for suffix in SUMMARY_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and families.get(base) == "summary":
            return base
    return None


def has_matcher(matchers, wanted):
    if matchers is None:
        return False
    compact = re.sub(r"\s+", "", matchers)
    return wanted.replace(" ", "") in compact


# ------------------------------------------------------------------ rules files

def rule_expressions(path):
    """Returns [(line number, expr)] for every 'expr:' key of a YAML rules file, line by line.

    Handles 'expr: one line', quoted values, plain values continued on more-indented lines, and
    block scalars ('expr: |', '|-', '>', '>-'...). Anything fancier is not used by our rules.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    found = []
    key = re.compile(r"^(\s*(?:-\s+)?)expr:(.*)$")
    i = 0
    while i < len(lines):
        m = key.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))  # the column of "expr", past any "- "
        value = m.group(2).strip()
        start = i + 1
        i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        if re.match(r"^[|>][-+0-9]*\s*(#.*)?$", value):
            expr = "\n".join(l.strip() for l in body)
        elif value[:1] in ("'", '"'):
            text = " ".join([value] + [l.strip() for l in body])
            q = text[0]
            end = text.rfind(q)
            expr = text[1:end] if end > 0 else text[1:]
            if q == "'":
                expr = expr.replace("''", "'")
            else:
                expr = expr.replace('\\"', '"').replace("\\\\", "\\")
        else:
            value = re.sub(r"\s+#.*$", "", value)
            expr = " ".join([value] + [re.sub(r"\s+#.*$", "", l.strip()) for l in body if
                                       not l.strip().startswith("#")]).strip()
        found.append((start, expr))
    return found


def recorded_names(path):
    """Returns the names the 'record:' keys of a rules file define."""
    with open(path, encoding="utf-8") as f:
        return set(re.findall(r"^\s*(?:-\s+)?record:\s*[\"']?([A-Za-z_:][A-Za-z0-9_:]*)", f.read(), re.M))


# ------------------------------------------------------------------ dashboards

def walk_panels(panels):
    for p in panels or []:
        yield p
        yield from walk_panels(p.get("panels"))


def is_datasource_ref(ds):
    uid = ds.get("uid") if isinstance(ds, dict) else ds
    return uid in ("${datasource}", "$datasource")


def check_dashboard(path, problems):
    """Returns [(where, expr, needs_filters)] of the dashboard's PromQL; adds structural problems."""
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        problems.add(path, f"not valid JSON: {e}")
        return []
    if not isinstance(dash, dict) or not isinstance(dash.get("panels"), list):
        problems.add(path, "not a dashboard: no \"panels\" list")
        return []
    exprs = []

    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", []) if isinstance(v, dict)}
    ds = variables.get("datasource")
    if ds is None or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.add(path, 'no template variable "datasource" of type datasource with query "prometheus"')
    for name in ("job", "instance"):
        if name not in variables:
            problems.add(path, f'no template variable "{name}"')
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        if not is_datasource_ref(v.get("datasource")):
            problems.add(path, f'variable "{name}" does not query the ${{datasource}} variable')
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        for text in {q, v.get("definition")} - {None, ""}:
            exprs.append((f'{path}: variable "{name}"', text, False))

    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            exprs.append((f'{path}: annotation "{a.get("name")}"', a["expr"], True))

    ids = set()
    cells = {}
    for p in walk_panels(dash["panels"]):
        title = p.get("title", "?")
        where = f'{path}: panel "{title}"'
        if "type" not in p:
            problems.add(where, "no type")
        if p.get("id") in ids:
            problems.add(where, f"duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        gp = p.get("gridPos")
        if not isinstance(gp, dict) or not all(isinstance(gp.get(k), int) for k in "hwxy"):
            problems.add(where, "no gridPos with integer h, w, x, y")
        elif gp["x"] + gp["w"] > 24:
            problems.add(where, "wider than the 24 grid columns")
        elif p in dash["panels"]:  # collapsed rows' panels have their own layout
            for dx in range(gp["w"]):
                for dy in range(gp["h"]):
                    other = cells.setdefault((gp["x"] + dx, gp["y"] + dy), title)
                    if other != title:
                        problems.add(where, f'overlaps panel "{other}"')
                        break
                else:
                    continue
                break
        if p.get("type") == "row":
            continue
        if not p.get("description"):
            problems.add(where, "no description")
        if not is_datasource_ref(p.get("datasource")):
            problems.add(where, "datasource is not ${datasource}")
        targets = p.get("targets") or []
        if not targets:
            problems.add(where, "no targets")
        for t in targets:
            if not t.get("refId"):
                problems.add(where, "a target without refId", t.get("expr"))
            if "datasource" in t and not is_datasource_ref(t["datasource"]):
                problems.add(where, f"target {t.get('refId')}: datasource is not ${{datasource}}")
            if not t.get("expr"):
                problems.add(where, f"target {t.get('refId')}: no expr")
                continue
            exprs.append((f"{where} target {t.get('refId')}", t["expr"], True))
    return exprs


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exposition", required=True, help="a scrape of lifeline-agent's /metrics")
    ap.add_argument("--readme", required=True, help="README.md with the metrics table")
    ap.add_argument("files", nargs="+", help="dashboard .json and Prometheus rules .yml files")
    args = ap.parse_args()

    problems = Problems()
    families = read_exposition(args.exposition)
    lifeline_families = {n: t for n, t in families.items() if n.startswith("lifeline_")}
    if not lifeline_families:
        problems.add(args.exposition, "no lifeline_* family (no '# TYPE lifeline_...' line)")

    backticked, table = read_readme(args.readme)
    for name in sorted(lifeline_families):
        if name not in backticked:
            problems.add(args.readme, f"exported family `{name}` is not documented (no `{name}` in backticks)")
    for name, typ in sorted(table.items()):
        if name not in families:
            problems.add(args.readme, f"metrics table lists `{name}`, which the exposition does not export")
        elif families[name] != typ:
            problems.add(args.readme, f"metrics table says `{name}` is a {typ}; the exposition says {families[name]}")

    # A recording rule's series is as good as an exported family for the expressions that use it.
    recorded = set()
    for path in args.files:
        if path.endswith((".yml", ".yaml")):
            try:
                recorded |= recorded_names(path)
            except OSError:
                pass  # reported below

    n_exprs = 0
    used = set()
    for path in args.files:
        if path.endswith(".json"):
            exprs = check_dashboard(path, problems)
        elif path.endswith((".yml", ".yaml")):
            try:
                exprs = [(f"{path}:{line}", e, False) for line, e in rule_expressions(path)]
            except OSError as e:
                problems.add(path, f"cannot read: {e}")
                continue
            if not exprs:
                problems.add(path, "no expr: found")
        else:
            problems.add(path, "neither a dashboard (.json) nor a rules file (.yml, .yaml)")
            continue
        for where, expr, needs_filters in exprs:
            n_exprs += 1
            sels = list(selectors(expr))
            for name, matchers in sels:
                fam = family_of(name, families)
                if fam is None and name in recorded:
                    continue
                if fam is None:
                    problems.add(where, f"metric {name} is not in the exposition", expr)
                    continue
                used.add(fam)
                if needs_filters:
                    missing = [m for m in REQUIRED_MATCHERS if not has_matcher(matchers, m)]
                    if missing:
                        problems.add(where, f"selector {name} lacks {' and '.join(missing)}", expr)
            if needs_filters and not sels and not has_matcher(expr, REQUIRED_MATCHERS[0]):
                problems.add(where, f"expression lacks {REQUIRED_MATCHERS[0]}", expr)

    for line in problems.items:
        print(line)
    verdict = "FAIL" if problems.items else "OK"
    print(f"check_names: {verdict}: {len(args.files)} file(s), {n_exprs} expression(s), "
          f"{len(used)} of {len(lifeline_families)} lifeline families used, {len(problems.items)} problem(s)")
    return 1 if problems.items else 0


if __name__ == "__main__":
    sys.exit(main())
