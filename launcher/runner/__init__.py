"""Code that runs inside the user's interpreter, around the user's program: program.py.

Nothing is imported here on purpose: the frameworks' runners (their ``run.py``) load program.py by
path under a private name, since the user's interpreter may not have the launcher importable. A
wrapper that runs as ``python -m launcher...`` where the launcher is installed, and the tests,
import it by this package's name.
"""
