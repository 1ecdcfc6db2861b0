"""Runtime error: the worker exits early (sys.exit inside run), so no result record arrives."""
import sys


def run(G, steps=5):
    sys.exit(0)
