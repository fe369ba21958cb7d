"""Stage 2: generated files: Dockerfiles from templates, the catalogue, the CI workflows."""
