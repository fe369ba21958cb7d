"""The contracts between stages: formats and their parsers, and the tables and policies several stages share
(docs/development.md's package map). Imported by buildtool's stages and by image-tests alike; it imports no stage.
"""
