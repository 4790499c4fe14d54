"""Small sub-commands that belong to no larger area."""
