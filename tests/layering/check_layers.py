#!/usr/bin/env python3
"""Every layer of Lifeline includes only the layers below it.

Usage: check_layers.py [--root DIR]     check the tree (exit 1 naming each upward include)
       check_layers.py --self-test      check that the rule catches what it must, on made-up trees

The layers, lowest first (a file may include headers of its own layer and of lower ones):

  base      lib/base/, and the public headers every layer may use: lifeline/status.h, dtype.h,
            export.h, log.h
  formats   formats/: the byte codecs, pure (no Env, no files of their own)
  env       lib/src/env/: the operating-system seam; with it the library's other public headers
            (lifeline/*.h: the interface every layer above implements or uses)
  trace     lib/src/trace/: the rings the agent reads
  store     lib/src/store/: names, scans and locks of a checkpoint directory
  load      lib/src/load/: reading and resharding
  save      lib/src/save/: planning, staging, writing, commit and retention
  tier      lib/src/tier/: the memory tier
  convert   lib/src/convert/: HDF5, safetensors, resharding copies
  api       lib/src/api/: Checkpointer, inspect, the C API
  net       lib/net/: sockets and the replica stream (not in liblifeline: the library opens no port)
  python | agent | tools   peers at the top: none includes another (the lifeline tool does not
            include the agent; the Python extension neither)

A header of lib/include/lifeline/internal/x.h belongs to the layer of the source file that
implements it (x.cc, which includes it first). Tests (*_test.cc, *_fuzz.cc, tests/) may include anything.

What is above liblifeline (net, python, agent, tools) uses only what the library publishes: its
public headers (lifeline/*.h) and the internal interface it declares for its own programs
(lifeline/internal/*.h), never a header of lib/src/, however the include names it (from the root
or relative to the including file), so that the library's inside can change without them.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

LAYERS = ["base", "formats", "env", "trace", "store", "load", "save", "tier", "convert", "api", "net", "top"]
RANK = {name: i for i, name in enumerate(LAYERS)}
PREFIXES = [  # longest first
    ("lib/src/env/", "env"), ("lib/src/trace/", "trace"), ("lib/src/store/", "store"), ("lib/src/load/", "load"),
    ("lib/src/save/", "save"), ("lib/src/tier/", "tier"), ("lib/src/convert/", "convert"), ("lib/src/api/", "api"),
    ("lib/net/", "net"), ("lib/base/", "base"), ("formats/", "formats"),
    ("lib/python/", "top:python"), ("agent/", "top:agent"), ("tools/", "top:tools"),
]
BASE_HEADERS = {"lib/include/lifeline/" + h for h in ("status.h", "dtype.h", "export.h", "log.h")}
SOURCE = re.compile(r"\.(cc|h|cu)$")
# Blanks as [ \t], not \s: \s would match the empty lines above an include, and name the wrong line.
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)


def is_test(path):
    return path.startswith("tests/") or re.search(r"_(test|fuzz)\.cc$", path) is not None


def sources(root):
    for top in ("lib", "formats", "agent", "tools", "tests"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if SOURCE.search(name):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


# Layers outside liblifeline: they may not include lib/src/ (see the module's comment).
ABOVE_LIBRARY = ("net", "top:python", "top:agent", "top:tools")
LIBRARY_INSIDE = "lib/src/"


def resolve(root, path, target):
    """The file an include names, relative to the root, as the compiler finds it: next to the
    including file first, then from the root (-I of the source tree), then lib/include (lifeline/...).
    None when it is none of the tree's files (a system or generated header)."""
    candidates = [os.path.join(os.path.dirname(path), target), target]
    if target.startswith("lifeline/"):
        candidates.append("lib/include/" + target)
    for c in candidates:
        c = os.path.normpath(c)
        if c.startswith("..") or os.path.isabs(c):
            continue
        if os.path.isfile(os.path.join(root, c)):
            return c.replace(os.sep, "/")
    return None


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = []
    for m in INCLUDE.finditer(text):
        resolved = resolve(root, path, m.group(1))
        if resolved is not None:
            out.append((text.count("\n", 0, m.start()) + 1, resolved))
    return out


def internal_header_layers(root, files):
    """lib/include/lifeline/internal/x.h -> the layer of x.cc, the source file that implements it
    (found by name, and including it first)."""
    owners = {}
    for path in files:
        if not path.endswith(".cc") or is_test(path):
            continue
        found = includes(root, path)
        if found and found[0][1] == "lib/include/lifeline/internal/" + os.path.basename(path)[:-3] + ".h":
            owners.setdefault(found[0][1], path)
    return {h: layer_of(p, {}) for h, p in owners.items()}


def layer_of(path, internal):
    if path in BASE_HEADERS:
        return "base"
    if path.startswith("lib/include/lifeline/internal/"):
        return internal.get(path, "env")
    if path.startswith("lib/include/"):
        return "env"
    for prefix, layer in PREFIXES:
        if path.startswith(prefix):
            return layer
    return None


def rank(layer):
    return RANK["top" if layer.startswith("top:") else layer]


def violations(root):
    files = sorted(sources(root))
    internal = internal_header_layers(root, files)
    found = []
    for path in files:
        if is_test(path):
            continue
        mine = layer_of(path, internal)
        if mine is None:
            continue
        for line, target in includes(root, path):
            if mine in ABOVE_LIBRARY and target.startswith(LIBRARY_INSIDE):
                found.append(f"{path}:{line}: {mine} includes {target}, inside liblifeline: use what the library "
                             "publishes (lifeline/*.h, or lifeline/internal/*.h for Lifeline's own programs)")
                continue
            theirs = layer_of(target, internal)
            if theirs is None or theirs == mine:
                continue
            if rank(theirs) > rank(mine) or (mine.startswith("top:") and theirs.startswith("top:")):
                found.append(f"{path}:{line}: {mine} includes {target} ({theirs}), "
                             + ("a peer" if rank(theirs) == rank(mine) else "a layer above it"))
    return found


def self_test():
    cases = {  # file -> (contents, refused: False, True, or the line the refusal must name)
        "lib/src/load/reader.cc": ('#include "lib/src/save/writer.h"\n', 1),
        "lib/src/save/writer.cc": ('#include "lib/src/save/writer.h"\n#include "lib/src/load/reader.h"\n', False),
        "lib/src/save/relative.cc": ('#include "../load/reader.h"\n', False),  # resolved next to the file: load
        "lib/src/load/relative.cc": ('#include <vector>\n#include "../save/writer.h"\n', 2),  # save, above load
        "formats/codec.cc": ('#include "lifeline/env.h"\n', True),
        "formats/model.cc": ('#include "lifeline/status.h"\n', False),
        "tools/lifeline/bench.cc": ('#include "agent/net/socket.h"\n', True),
        "agent/agent.cc": ('#include "lib/net/socket.h"\n#include "lifeline/internal/ring.h"\n', False),
        # Above the library: lib/src/ refused whatever layer it is, from the root or by a relative path.
        "agent/lock.cc": ('#include "lib/net/socket.h"\n#include "lib/src/api/c.h"\n', 2),
        "tools/x.cc": ('#include "lifeline/env.h"\n#include "lib/src/save/foo.h"\n', 2),
        "tools/lifeline/y.cc": ('#include <string>\n\n#include "../../lib/src/save/foo.h"\n', 3),
        "lib/python/binding.cc": ('#include "lib/src/env/io.h"\n', 1),
        "lib/net/stream.cc": ('#include "lifeline/internal/ring.h"\n#include "../src/env/io.h"\n', 2),
        "tools/x_test.cc": ('#include "lib/src/save/foo.h"\n', False),  # tests may include anything
        "lib/src/env/ring_user.cc": ('#include "lifeline/internal/ring.h"\n', True),  # ring.cc is in trace/, above env
        "lib/src/store/scan.cc": ('#include "lifeline/internal/ring.h"\n', False),
        "lib/src/trace/ring.cc": ('#include "lifeline/internal/ring.h"\n', False),
        "lib/src/env/posix.cc": ('#include "tests/kit/test_kit.h"\n', False),  # not a layer: ignored
        "lib/src/save/writer_test.cc": ('#include "lib/src/api/c.h"\n', False),  # tests may include anything
    }
    headers = ["lib/src/save/writer.h", "lib/src/load/reader.h", "lifeline/env.h", "lifeline/status.h",
               "agent/net/socket.h", "lib/net/socket.h", "lib/src/api/c.h", "lifeline/internal/ring.h",
               "tests/kit/test_kit.h", "lib/src/save/foo.h", "lib/src/env/io.h"]
    tmp = tempfile.mkdtemp(prefix="lifeline-layers-")
    try:
        for h in headers:
            p = os.path.join(tmp, "lib/include/" + h if h.startswith("lifeline/") else h)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "w").close()
        for path, (text, _) in cases.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, path)), exist_ok=True)
            with open(os.path.join(tmp, path), "w") as f:
                f.write(text)
        found = violations(tmp)
        wrong = []
        for path, (_, refused) in cases.items():
            flagged = any(v.startswith(path + ":") for v in found)
            if flagged != bool(refused):
                wrong.append(f"{path}: {'not refused' if refused else 'refused'}, expected the opposite")
            elif refused is not True and refused and not any(v.startswith(f"{path}:{refused}: ") for v in found):
                wrong.append(f"{path}: refused, but not naming line {refused}")
        for w in wrong:
            print("self-test:", w)
        print(f"self-test: {len(cases) - len(wrong)} of {len(cases)} cases as expected")
        return 1 if wrong else 0
    finally:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    found = violations(args.root)
    for v in found:
        print(v)
    print(f"layering: {len(found)} upward, sideways or inward include(s)" if found else "layering: every include goes down")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
