"""Running a container: the verbs, launch, the root filesystem, mounts,
environment, hooks, seccomp. Imports image/ and the ground floor."""
