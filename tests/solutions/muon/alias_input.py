"""Integrity violation: returns a view of the input (same shape and dtype)."""


def run(G, steps=5):
    return G.view(G.shape)
