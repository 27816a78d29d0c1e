"""Benchmarks that run gfaas against real peers in one run (``gfaas bench ...``)."""
