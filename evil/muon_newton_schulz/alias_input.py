"""Catalogue #19: returning an input or a view of it.

Trick: return ``G`` reshaped (same shape and dtype as the output).
Expected: ``integrity_violation`` / ``no_aliasing`` (outputs may not share storage with inputs).
"""
EXPECT = {"status": "integrity_violation", "rule": "no_aliasing", "catalogue": [19], "device": "cpu", "static": []}


def run(G, steps=5):
    return G.view(G.shape)
