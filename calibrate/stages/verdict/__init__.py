"""No verdict surer than its measurements (SPEC §5.14): what every verdict that names a setting
shares — the ladder's setting, the sweep's knee, ``--find-max``'s boundary, the rate sweep's
recommendation and tune's winner.

- ``separation``: whether two settings' runs tell them apart (pure);
- ``doubt``: the pairs they could not, and the stage's inconclusive line — its cause named from
  the machine's own noise (``gpu.noise``) and what to do about it.
"""
