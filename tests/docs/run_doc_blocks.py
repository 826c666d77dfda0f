#!/usr/bin/env python3
"""The README's and docs/'s pages as a reader walks them: links resolve and runnable blocks run.

Usage: run_doc_blocks.py [--bin DIR] [--venv-bin DIR] [--pythonpath DIR] [--timeout S]
                         [--links-only] [--list] [-v] PAGE...

For every PAGE (README.md, docs/*.md):

- **Links.** Every relative link `[text](path#anchor)` outside code points to a file or directory
  that exists, and every `#anchor` (of another page or of the page itself) to a heading of that
  page, by GitHub's rule for heading ids. A README.md given as a PAGE must link every docs/*.md
  page beside it (its "where to go next").
- **Runnable blocks.** A fenced block whose info string is `sh runnable` (GitHub renders it as sh)
  is run with `bash -euo pipefail`; a fenced block whose info string holds `file=NAME` (say
  ```` ```python file=train.py ````) is written to NAME, as the page tells the reader to save it.
  All the blocks of a page run in order in one fresh temporary directory (under
  $LIFELINE_TEST_TMPDIR, default /var/tmp: on disk, as O_DIRECT wants), so a block may use what an
  earlier runnable or file block of the same page made; never what another page made. `timeout=S`
  in the info string overrides the per-block timeout. Other blocks (plain `sh`, `python`, `yaml`,
  ...) are shown, not run: the page says what they need (several machines, a GPU, a checkout,
  minutes of a GiB-sized benchmark).
- **Info strings.** Only `runnable`, `file=NAME` and `timeout=S` may follow the language (a typo
  such as `runable` would silently leave a block unrun), `runnable` only on sh blocks, and no
  runnable block pipes into `head` (under pipefail the writer's SIGPIPE fails it by chance).

The environment is the reader's after install, made from the build tree rather than a wheel:
`--bin` (build/bin: lifeline, lifeline-agent, lifeline-drill, lifeline-sim) and `--venv-bin`
(.venv/bin: python with torch) first on PATH, and `--pythonpath` (build/python-venv, the package
built for .venv's Python) on PYTHONPATH, as the python-venv ctest tests have it; `pip install .`
itself is tested by venv_wheel_install. What would leak between runs or into other tests is kept
in the page's directory: the memory tier (LIFELINE_MEMORY_TIER_DIR, a fresh directory under
/dev/shm) and the agent's default run directory (XDG_RUNTIME_DIR); the environment's LIFELINE_*,
RANK, WORLD_SIZE and MASTER_* are cleared. Each block runs in a process group of its own, which is
killed when the block ends or times out. A failing block is reported as FILE:LINE with its text
and output, and ends its page (later blocks build on it); the other pages still run.
Exit status: 0 when every page passed, 1 otherwise.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


class Block:
    def __init__(self, page, line, info, text):
        self.page = page
        self.line = line      # 1-based line of the opening fence
        self.info = info.strip()
        self.text = text
        words = self.info.split()
        self.lang = words[0] if words else ""
        self.runnable = "runnable" in words[1:] and self.lang in ("sh", "bash", "shell")
        self.file = None
        self.timeout = None
        for w in words[1:]:
            if w.startswith("file="):
                self.file = w[len("file="):]
            elif w.startswith("timeout="):
                self.timeout = float(w[len("timeout="):])

    def where(self):
        return f"{self.page}:{self.line}"


def parse(page):
    """Returns (blocks, prose): the fenced blocks, and the lines outside them as (number, text)."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, prose = [], []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, start = m.group("fence"), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^ {0,3}" + re.escape(fence[0]) + "{%d,}\\s*$" % len(fence), lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise SystemExit(f"{page}:{start + 1}: a code block that never closes")
        blocks.append(Block(page, start + 1, m.group("info"), "\n".join(body) + "\n"))
        i += 1
    return blocks, prose


# ------------------------------------------------------------------ links and anchors

def heading_ids(page):
    """The ids GitHub gives the headings of `page`."""
    _, prose = parse(page)
    ids, seen = set(), {}
    for _, line in prose:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def check_links(page, failures):
    _, prose = parse(page)
    here = os.path.dirname(os.path.abspath(page))
    linked = set()
    for number, line in prose:
        code_free = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", code_free):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(here, path)) if path else os.path.abspath(page)
            where = f"{page}:{number}"
            if not os.path.exists(full):
                failures.append(f"{where}: link to {target}: {path} does not exist")
                continue
            linked.add(full)
            if anchor:
                if not full.endswith(".md") or os.path.isdir(full):
                    failures.append(f"{where}: link to {target}: an anchor into something that is not a page")
                elif anchor not in heading_ids(full):
                    failures.append(f"{where}: link to {target}: {os.path.relpath(full)} has no heading #{anchor}")
    if os.path.basename(page) == "README.md":
        docs = os.path.join(here, "docs")
        if os.path.isdir(docs):
            for name in sorted(os.listdir(docs)):
                full = os.path.join(docs, name)
                if name.endswith(".md") and full not in linked:
                    failures.append(f"{page}: docs/{name} is not linked from the README")


# ------------------------------------------------------------------ runnable blocks

def environment(args, workdir, tier):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LIFELINE_") and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
                                                          "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")}
    path = [p for p in (args.bin, args.venv_bin) if p]
    env["PATH"] = os.pathsep.join(path + [env.get("PATH", "/usr/bin:/bin")])
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    env["LIFELINE_MEMORY_TIER_DIR"] = tier
    runtime = os.path.join(workdir, ".run")
    os.makedirs(runtime, mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = runtime
    env["HOME"] = os.environ.get("HOME", workdir)
    return env


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_block(block, workdir, env, timeout, script_number):
    """Runs one runnable block; returns (ok, seconds, output)."""
    script = os.path.join(workdir, f".block{script_number}.sh")
    with open(script, "w", encoding="utf-8") as f:
        f.write(block.text)
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-euo", "pipefail", script], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = f"exit {proc.returncode}"
        ok = proc.returncode == 0
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        status = f"no end within {timeout:.0f} s (killed)"
        ok = False
    finally:
        kill_group(proc)  # what the block left running in the background
        os.unlink(script)
    seconds = time.monotonic() - started
    return ok, seconds, status, out.decode("utf-8", "replace")


def lint(blocks, failures):
    """Mistakes that would make a block silently not run, or run flakily."""
    for b in blocks:
        words = b.info.split()[1:]
        unknown = [w for w in words if w != "runnable" and not w.startswith(("file=", "timeout="))]
        if unknown:
            failures.append(f"{b.where()}: unknown word(s) in the info string '{b.info}': {' '.join(unknown)} "
                            "(known: runnable, file=NAME, timeout=SECONDS)")
        if "runnable" in words and not b.runnable:
            failures.append(f"{b.where()}: 'runnable' on a '{b.lang}' block: only sh blocks run")
        if b.runnable and re.search(r"\|\s*head\b", b.text):
            failures.append(f"{b.where()}: a runnable block pipes into head: under pipefail the writer's "
                            "SIGPIPE fails the block when head stops reading first; use sed -n 1,Np")


def run_page(page, blocks, args, failures):
    todo = [b for b in blocks if b.runnable or b.file]
    if not any(b.runnable for b in todo):
        return
    base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
    workdir = tempfile.mkdtemp(prefix="lifeline-docs-", dir=base)
    tier = tempfile.mkdtemp(prefix="lifeline-docs-tier-", dir="/dev/shm" if os.path.isdir("/dev/shm") else base)
    env = environment(args, workdir, tier)
    print(f"== {page}: {sum(b.runnable for b in todo)} runnable block(s) in {workdir}", flush=True)
    try:
        for n, block in enumerate(todo):
            if block.file:
                target = os.path.normpath(os.path.join(workdir, block.file))
                if not target.startswith(workdir + os.sep):
                    failures.append(f"{block.where()}: file={block.file} is outside the page's directory")
                    return
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w", encoding="utf-8") as f:
                    f.write(block.text)
                print(f"-- {block.where()}: wrote {block.file}", flush=True)
                continue
            timeout = block.timeout or args.timeout
            ok, seconds, status, out = run_block(block, workdir, env, timeout, n)
            print(f"-- {block.where()}: {'ok' if ok else 'FAILED'} in {seconds:.1f} s", flush=True)
            if args.verbose or not ok:
                sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
            if not ok:
                failures.append(f"{block.where()}: the runnable block failed ({status}); its text:\n"
                                + "".join("    " + l + "\n" for l in block.text.rstrip("\n").split("\n"))
                                + "its output (last 60 lines):\n"
                                + "".join("    " + l + "\n" for l in out.rstrip("\n").split("\n")[-60:]))
                return  # the page's later blocks build on this one
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(tier, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pages", nargs="+", metavar="PAGE")
    ap.add_argument("--bin", help="directory of lifeline, lifeline-agent, lifeline-drill, lifeline-sim (build/bin)")
    ap.add_argument("--venv-bin", help="the virtual environment's bin directory (python with torch)")
    ap.add_argument("--pythonpath", help="directory holding the lifeline package (build/python-venv)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per block (default 180)")
    ap.add_argument("--links-only", action="store_true", help="check links and anchors, run nothing")
    ap.add_argument("--list", action="store_true", help="list every block: runnable, file or shown only")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every block's output")
    args = ap.parse_args()
    for name in ("bin", "venv_bin", "pythonpath"):  # the blocks run elsewhere
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))

    failures = []
    started = time.monotonic()
    for page in args.pages:
        blocks, _ = parse(page)
        if args.list:
            for b in blocks:
                kind = "runnable" if b.runnable else f"file {b.file}" if b.file else "shown"
                print(f"{b.where()}: {b.info or '(no info)'}: {kind}")
            continue
        before = len(failures)
        check_links(page, failures)
        lint(blocks, failures)
        if not args.links_only and len(failures) == before:
            run_page(page, blocks, args, failures)
        print(f"== {page}: {'ok' if len(failures) == before else 'FAILED'}", flush=True)
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for f in failures:
            print(f, file=sys.stderr)
        return 1
    if not args.list:
        print(f"all pages passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
