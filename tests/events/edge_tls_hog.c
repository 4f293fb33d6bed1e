/* SPDX-License-Identifier: MIT */
/* A library with 1200 bytes of initial-exec TLS: what other dlopen'ed libraries may already have
 * taken of glibc's static TLS surplus (edge_tls.c). */
__thread char edge_tls_hog_buf[1200] __attribute__((tls_model("initial-exec")));

char *edge_tls_hog(void);
char *edge_tls_hog(void)
{
	return edge_tls_hog_buf;
}
