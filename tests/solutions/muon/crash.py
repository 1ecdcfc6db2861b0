"""Runtime error: raises inside run()."""


def run(G, steps=5):
    raise RuntimeError("kernel launch failed on purpose")
