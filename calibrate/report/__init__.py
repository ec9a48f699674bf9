"""What a finished run looks like to a reader: tables, comparisons, timelines, progress, HTML."""
