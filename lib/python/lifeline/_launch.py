"""The `lifeline`, `lifeline-agent` and `lifeline-sim` commands of an installed wheel: each execs its
program from lifeline/_bin with the same arguments, so it is the program that runs, signals and
exit status included. Imports nothing but os and sys: these run before every command."""

import os
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def _exec(program, **defaults):
    for name, value in defaults.items():
        if not os.environ.get(name):  # the user's own setting wins
            os.environ[name] = value
    path = os.path.join(_BIN, program)
    # argv[0] as the user typed it, so usage and errors name the command they know.
    os.execv(path, [sys.argv[0] or program] + sys.argv[1:])


def cli():
    _exec("lifeline")


def agent():
    # It finds the ranks' start-up hook from its own place (site-packages/lifeline_startup).
    _exec("lifeline-agent")


def sim():
    _exec("lifeline-sim", LIFELINE_SIM_PLOT=os.path.join(_BIN, "sim_plot.py"))
