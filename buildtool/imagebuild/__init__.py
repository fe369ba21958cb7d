"""Stage 3: building images: the Docker engine, bases (debootstrap, stand-ins), pip settings, the builder."""
