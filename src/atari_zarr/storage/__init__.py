"""Where stores and sources live: paths, URLs, remote access with deadlines, the range cache."""
