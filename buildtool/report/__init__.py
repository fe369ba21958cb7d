"""The nightly report: verdicts into HTML and Markdown."""
