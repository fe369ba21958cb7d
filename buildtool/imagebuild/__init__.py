"""Stage 3: building images: the Docker engine, bases (mmdebstrap, stand-ins), pip settings, the builder."""
