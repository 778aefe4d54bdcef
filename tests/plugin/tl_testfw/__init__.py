"""A framework that is not the launcher's: the proof that a new framework is one package and one
registry entry, with no line of ``launcher/`` touched (tests/test_plugin_framework.py).

Registered as another package would register it, by an entry point of the group
``trainer_launcher.frameworks`` in its distribution's metadata (the test writes that metadata).
Its collective: a function named ``tl_testfw_collective``, which the hang check must know as one.
"""

from launcher.frameworks import Framework

FRAMEWORK = Framework("testfw", collective_frames=(r"in tl_testfw_collective\b",), module="tl_testfw.command")
