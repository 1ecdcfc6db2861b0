"""Compile error: the module does not parse."""


def run(G, steps=5)
    return G
