"""Runtime error after a slow import: the import takes 1.5 s (a stand-in for a worker start-up
whose cost shows in the phase accounting), then run() raises."""

import time

time.sleep(1.5)


def run(G, steps=5):
    raise RuntimeError("kernel launch failed on purpose")
