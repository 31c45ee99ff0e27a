"""Sandbox backends: the interface (``base``) and its Docker implementation (containers,
images, labels and cleanup). The only importer of docker."""
