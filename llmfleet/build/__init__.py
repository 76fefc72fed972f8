"""Build and delivery on the controller: images, wheelhouses, venvs, the toolchain, generated docs."""
