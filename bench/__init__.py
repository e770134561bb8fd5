"""Benchmarks: fastapi_jobs side by side with the asyncio floor and its peers.

Run ``python -m bench`` (see ``bench/__main__.py``); its tables go to BENCHMARKS.md,
which holds nothing else; the notes written by hand are docs/development/benchmark-notes.md.
"""
