"""Detached sweeps: a controller VM runs the sweep; the user follows, steers and pulls it.

`layout` names what lives in the bucket, `submit` starts a detached sweep (``--detach``),
`agent` runs it on the controller, `mirror` keeps the sweep folder in the bucket, `index`
remembers the user's sweeps by id, and ``python -m orchestrator.controller`` (`__main__`) is
the user's ``status``, ``logs``, ``attach``, ``cancel``, ``pull`` and ``resume``.
"""
