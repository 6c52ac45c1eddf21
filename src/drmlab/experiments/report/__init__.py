"""``drmlab report``: ``pages`` decides what a directory is and builds its page from ``html``'s pieces."""
