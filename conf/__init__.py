"""The config tree as a package, ``orchestrator.conf`` (``orchestrator/conf`` links here), so a
wheel, an sdist install, an editable install and the checkout all find it at ``pkg://orchestrator.conf``."""
