"""Reporting: the eval command and its image files, run comparison pages and tree reports."""
