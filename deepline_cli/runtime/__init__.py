"""What runs a play: its packages are layered, each importing only those below it
(planning > run > map > calls > providers; checked by `lint-imports`)."""

__all__ = ["calls", "map", "planning", "providers", "run"]
