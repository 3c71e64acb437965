"""Running generated kernels: support checks, config selection, descriptor caches, launches."""
