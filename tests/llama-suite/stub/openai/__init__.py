"""Stand-in for the `openai` Python package, which Debian 12 does not package.

llama.cpp's test modules import `from openai import OpenAI` at module level; with this
stub those modules still load, their tests that do not use the client run, and each test
that constructs the client fails the same way direct and through kvpersist
(see docs/llama-suite.md).
"""


class OpenAI:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("openai Python package not installed here (tests/llama-suite/stub)")
