"""Stand-in package (see ``vllm/__init__.py``)."""
