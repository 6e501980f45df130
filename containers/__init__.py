"""Container images for Shoal jobs: templates, the version matrix, builds and pushes."""
