"""Discrete-event simulation of GPU clusters running the same policies as the real runtime."""
