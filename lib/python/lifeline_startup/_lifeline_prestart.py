"""A spare rank of lifeline-agent: a Python interpreter started ahead of the next launch.

    python [options] _lifeline_prestart.py FD SCRIPT [ARGS...]

Started by the agent (agent/prestart.h) while a launch trains, with the command the agent runs for
each rank. It imports what the script imports at its top level from outside the script's own
directory (torch, numpy, the lifeline package...; on torch 2.x also torch._dynamo, which
DistributedDataParallel and FSDP import when they are built), then waits on FD. When the job is
relaunched, the agent writes the rank's whole environment there and closes it; the spare
takes that environment as its own (os.environ: Python's and the C library's) and runs SCRIPT as
`python SCRIPT ARGS` would: as __main__, with sys.argv and sys.path[0] as Python sets them. An
end of file without an environment (the agent ended, or retired the spare) ends it quietly.

What differs from a fresh interpreter: the imports ran under the environment of the launch before
(the agent's own, with LIFELINE_PRESTART=1 and without RANK), so a module that reads a variable
while it is imported keeps the value it read then; `lifeline-agent --no-prestart` launches every
rank afresh. A module that fails to import is left to the script, which meets the same error.
"""

import ast
import importlib
import importlib.util
import os
import sys


def _top_level_imports(script, script_dir):
    """Modules the script imports in its module body (also under if/try/with at that level), in
    order, except those found in the script's own directory (they may read the rank's variables as
    they are imported) and relative imports."""
    try:
        with open(script, "rb") as f:
            tree = ast.parse(f.read(), filename=script)
    except (OSError, SyntaxError, ValueError):
        return []
    names = []

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    wanted = []
    for name in names:
        if name in wanted or name == "__future__":
            continue
        try:
            spec = importlib.util.find_spec(name.partition(".")[0])
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        places = ([spec.origin] if spec.has_location else []) + list(spec.submodule_search_locations or [])
        if not any(os.path.abspath(p).startswith(script_dir + os.sep) for p in places):
            wanted.append(name)
    return wanted


def _warm(names):
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:  # the script meets it again itself, with its own traceback
            pass
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", "0")
    if torch is not None and version.split(".")[0].isdigit() and int(version.split(".")[0]) >= 2:
        try:
            importlib.import_module("torch._dynamo")
        except BaseException:
            pass


def _read_all(fd):
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _main():
    fd = int(sys.argv[1])
    script = sys.argv[2]
    script_dir = os.path.dirname(os.path.abspath(script))
    sys.argv = sys.argv[2:]
    sys.path[0] = script_dir  # as `python SCRIPT` sets it, before anything is imported from it
    _warm(_top_level_imports(script, script_dir))
    data = _read_all(fd)
    os.close(fd)
    if not data:
        os._exit(0)  # retired, or the agent is gone: nothing to run
    # NAME=VALUE entries, each ended by a NUL byte (as in /proc/PID/environ), taken as bytes: a
    # value need not be UTF-8.
    os.environ.clear()
    for entry in data.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq and name:
            os.environb[name] = value
    hook = sys.modules.get("_lifeline_startup_hook")
    if hook is not None:
        hook.activate()
    import runpy
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _main()
