"""Scripted agents for the agent / campaign tests: fake-provider scripts and small solutions."""
