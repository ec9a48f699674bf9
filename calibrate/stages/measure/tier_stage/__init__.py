"""What the two tier stages, ladder and sweep, share around their run beyond the measuring every
stage does (``measure.tier_run``): who watches it live (``watch``), and what is done once the
tiers are in — the table, ``--compare`` (``compare_tiers``), the verdict (``tier_finish``)."""
