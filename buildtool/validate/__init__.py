"""Stage 4: validating an image with image-tests and recording its verdict by digest."""
