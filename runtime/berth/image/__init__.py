"""Getting an image: references, registries, pulls, archives, squashfs
building, the image cache, `berth import`. Imports only the ground floor
(config, errors, safedir, rootpath, syscalls)."""
