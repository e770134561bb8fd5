"""Benchmarks: fastapi_jobs side by side with the asyncio floor and its peers.

Run ``python -m bench`` (see ``bench/__main__.py``); results go to BENCHMARKS.md.
"""
