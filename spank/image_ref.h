/*
 * --container-image as the runtime and the node's files name it: a
 * squashfs or SIF file, an archive, or a registry reference and its URI, the
 * digest it was pinned to at submission, a custom importer's cache name.
 */
#ifndef BERTH_SPANK_IMAGE_REF_H
#define BERTH_SPANK_IMAGE_REF_H

#include <stddef.h>

/* Is the image a squashfs or SIF file rather than a registry reference? */
int image_is_file(const char *image);
/*
 * Do the n bytes of name end as an image file's name does (.sqsh, .sif)?
 * The runtime takes such a target for a file: no container may be so named.
 */
int image_file_name(const char *name, size_t n);
/* Is that file named as a SIF image (an Apptainer/Singularity one)? */
int image_is_sif(const char *image);
/* Length of a docker-archive:, oci-archive: or oci: prefix, else 0. */
size_t image_archive_prefix(const char *image);
/* URI handed to "berth import": docker:// unless a scheme is given */
int image_uri(const char *image, char *out, size_t outlen);
/* Length of a registry URI's docker:// or oras:// (a SIF image) scheme, else 0. */
size_t image_registry_scheme(const char *uri);
/*
 * A registry image's tag, resolved once per job at submission, reaches the
 * nodes as "URI\nPINNED" (URI as image_uri gives it, PINNED the runtime's
 * docker://...@sha256:... or oras://...@sha256:... of it, in URI's scheme).
 * image_pin: PINNED when text is for uri and PINNED is one such line, else
 * NULL.
 */
const char *image_pin(const char *text, const char *uri);
/* Cache file name for a registry image: '/', ':', '#', '@' become '+' */
int image_cache_name(const char *image, char *out, size_t outlen);

#endif
