"""A stored study read back and described: its trial table, the summary, text, JSON, HTML, plots."""
