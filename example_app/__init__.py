"""A small app that shows fastapi_jobs at work: `python -m example_app`."""
