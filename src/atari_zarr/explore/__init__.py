"""Seeing the data: an episode as a video (and, with it, what a notebook shows)."""
