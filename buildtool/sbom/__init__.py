"""The image's SBOM: the CycloneDX document made from an in-image probe (document), its Python and Debian
components (components, deb_licenses), and the copy the builder key signs (signing)."""
