/* See image_ref.h. Pure string work: no Slurm, no side effects. */
#include "image_ref.h"

#include <stdio.h>
#include <string.h>

/* Whether the n bytes of text end in suffix, with something before it. */
static int ends_with(const char *text, size_t n, const char *suffix)
{
	size_t k = strlen(suffix);

	return n > k && strncmp(text + n - k, suffix, k) == 0;
}

int image_file_name(const char *name, size_t n)
{
	return ends_with(name, n, ".sqsh") || ends_with(name, n, ".sif");
}

int image_is_file(const char *image)
{
	return image[0] == '/' || image[0] == '.' || image_file_name(image, strlen(image));
}

int image_is_sif(const char *image)
{
	return ends_with(image, strlen(image), ".sif");
}

size_t image_archive_prefix(const char *image)
{
	/* the archive forms berth import reads, named as skopeo names them */
	static const char *const prefixes[] = { "docker-archive:", "oci-archive:", "oci:" };

	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (strncmp(image, prefixes[i], strlen(prefixes[i])) == 0)
			return strlen(prefixes[i]);
	return 0;
}

int image_uri(const char *image, char *out, size_t outlen)
{
	int n;

	if (strstr(image, "://") != NULL || image_archive_prefix(image) > 0)
		n = snprintf(out, outlen, "%s", image);
	else
		n = snprintf(out, outlen, "docker://%s", image);
	return (n < 0 || (size_t)n >= outlen) ? -1 : 0;
}

size_t image_registry_scheme(const char *uri)
{
	static const char *const schemes[] = { "docker://", "oras://" };

	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strncmp(uri, schemes[i], strlen(schemes[i])) == 0)
			return strlen(schemes[i]);
	return 0;
}

const char *image_pin(const char *text, const char *uri)
{
	size_t n = strlen(uri), scheme = image_registry_scheme(uri);
	const char *pin;

	if (scheme == 0 || strncmp(text, uri, n) != 0 || text[n] != '\n')
		return NULL;
	pin = text + n + 1;
	/* pinned in the scheme it was asked in: a docker:// tag to docker://...@sha256: */
	if (strncmp(pin, uri, scheme) != 0 || strstr(pin, "@sha256:") == NULL ||
	    strchr(pin, '\n') != NULL)
		return NULL;
	return pin;
}

int image_cache_name(const char *image, char *out, size_t outlen)
{
	const char *scheme = strstr(image, "://");
	size_t i = 0;

	if (scheme != NULL)
		image = scheme + 3;
	for (; *image != '\0'; image++) {
		if (i + 1 >= outlen)
			return -1;
		out[i++] = strchr("/:#@", *image) ? '+' : *image;
	}
	if (i == 0 || i + sizeof(".sqsh") > outlen)
		return -1;
	memcpy(out + i, ".sqsh", sizeof(".sqsh"));
	return 0;
}
