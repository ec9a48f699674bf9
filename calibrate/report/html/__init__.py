"""The HTML report: the page, its parts, the answer first, comparisons, SVG plots."""
