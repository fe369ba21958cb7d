"""Shared leaf utilities: errors, image references, atomic files, units. Imports no other part."""
