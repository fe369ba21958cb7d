"""The contracts between stages: formats and their parsers, label keys, skip codes, the
target file image-tests read, the verdict, and the framework table.

Imported by buildtool's stages and by image-tests alike; it imports no stage. Submodules:
`names` (tags, revisions, artifact names), `label_keys`, `skips`, `target`, `verdict`,
`frameworks`, `releases` (the release manifest the catalogue reads), `gpu` (CUDA, drivers,
GPU runners), `versions` (framework version semantics).
"""
