"""Runtime error: the worker process dies from a signal inside run()."""
import os
import signal


def run(G, steps=5):
    os.kill(os.getpid(), signal.SIGSEGV)
