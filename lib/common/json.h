/* SPDX-License-Identifier: MIT */
/* A small JSON writer into a caller's buffer: the statistics (cache/stats.c) and gdrcache_info. */
#ifndef GDR_COMMON_JSON_H
#define GDR_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* s as a JSON string, quoted, '"' and '\' escaped with a backslash, control characters as \u00XX,
 * every other byte as it is (UTF-8 passes through). Into dst as snprintf would: at most cap bytes,
 * NUL-terminated when cap > 0. Returns the length the whole string needs (without the NUL). */
size_t gdr_json_quote(char *dst, size_t cap, const char *s);

/*
 * A document written member by member: the writer puts the commas (", ") and colons (": ")
 * itself. A value follows a key inside an object, stands alone in an array, or is the document.
 * Objects and arrays nest up to GDR_JSON_DEPTH deep. Nothing is written past cap: len keeps
 * counting what the document needs (gdr_json_ok says whether it fit). Not thread-safe: one writer
 * per document.
 */
#define GDR_JSON_DEPTH 32
struct gdr_json {
	char *p;
	size_t len, cap;
	unsigned depth;
	uint32_t more;  /* bit d: the container at depth d has a member already */
	uint32_t array; /* bit d: the container at depth d is an array */
	bool after_key; /* a key was written: the next value is its */
	bool broken;    /* nested too deep or closed too often */
};
void gdr_json_init(struct gdr_json *j, char *buf, size_t cap);
/* Whether everything written fit in the buffer (NUL-terminated), and every container was closed
 * by its own kind, after a value, not too deep. */
bool gdr_json_ok(const struct gdr_json *j);

void gdr_json_object_begin(struct gdr_json *j);
void gdr_json_object_end(struct gdr_json *j);
void gdr_json_array_begin(struct gdr_json *j);
void gdr_json_array_end(struct gdr_json *j);
/* A member's name, quoted and escaped as a string; its value comes next. */
void gdr_json_key(struct gdr_json *j, const char *key);
void gdr_json_str(struct gdr_json *j, const char *s);
void gdr_json_u64(struct gdr_json *j, uint64_t v);
void gdr_json_i64(struct gdr_json *j, int64_t v);
void gdr_json_bool(struct gdr_json *j, bool v);

#endif /* GDR_COMMON_JSON_H */
