"""A batch journal (``--out``): what it holds (``scan``) and what produced its results (``made``)."""
