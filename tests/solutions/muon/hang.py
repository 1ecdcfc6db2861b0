"""Timeout: never returns."""
import time


def run(G, steps=5):
    while True:
        time.sleep(0.5)
