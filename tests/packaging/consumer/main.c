/* SPDX-License-Identifier: MIT */
/* Links the installed libgdrcache and checks the header and the library agree on the version. */
#include <gdrcache.h>
#include <stdio.h>

int main(void)
{
	struct gdr_cache *c;
	struct gdr_cache_settings set;

	if (gdr_cache_version() != GDR_VERSION) {
		printf("header %#x, library %#x\n", GDR_VERSION, gdr_cache_version());
		return 1;
	}
	if (gdr_cache_create(NULL, &c) || gdr_cache_get_settings(c, &set, sizeof(set)) ||
	    gdr_cache_destroy(c))
		return 2;
	printf("consumer: libgdrcache %d.%d.%d found and working\n", GDR_VERSION_MAJOR,
	       GDR_VERSION_MINOR, GDR_VERSION_PATCH);
	return 0;
}
