/* SPDX-License-Identifier: MIT */
/* A small JSON writer into a caller's buffer (json.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"

/* One byte at dst[n] if it fits (room for the NUL kept). */
static void put_byte(char *dst, size_t cap, size_t n, char c)
{
	if (n + 1 < cap)
		dst[n] = c;
}

size_t gdr_json_quote(char *dst, size_t cap, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;

	put_byte(dst, cap, n++, '"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			put_byte(dst, cap, n++, '\\');
			put_byte(dst, cap, n++, (char)c);
		} else if (c < 0x20) {
			const char esc[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf] };

			for (int i = 0; i < 6; i++)
				put_byte(dst, cap, n++, esc[i]);
		} else {
			put_byte(dst, cap, n++, (char)c);
		}
	}
	put_byte(dst, cap, n++, '"');
	if (cap)
		dst[n < cap ? n : cap - 1] = '\0';
	return n;
}

void gdr_json_init(struct gdr_json *j, char *buf, size_t cap)
{
	memset(j, 0, sizeof(*j));
	j->p = buf;
	j->cap = cap;
	if (cap)
		buf[0] = '\0';
}

bool gdr_json_ok(const struct gdr_json *j)
{
	return !j->broken && j->len < j->cap;
}

static void put(struct gdr_json *j, const char *s)
{
	size_t n = strlen(s);

	if (j->len < j->cap)
		snprintf(j->p + j->len, j->cap - j->len, "%s", s);
	j->len += n;
}

/* Before a value or a key: the comma, unless it is the first of its container or a key's value. */
static void sep(struct gdr_json *j)
{
	if (j->after_key) {
		j->after_key = false;
		return;
	}
	if (j->more & (1u << j->depth))
		put(j, ", ");
	j->more |= 1u << j->depth;
}

static void container_open(struct gdr_json *j, const char *c)
{
	sep(j);
	put(j, c);
	if (j->depth + 1 >= GDR_JSON_DEPTH) {
		j->broken = true;
		return;
	}
	j->depth++;
	j->more &= ~(1u << j->depth);
	if (*c == '[')
		j->array |= 1u << j->depth;
	else
		j->array &= ~(1u << j->depth);
}

static void container_close(struct gdr_json *j, const char *c)
{
	if (!j->depth || j->after_key || !(j->array & (1u << j->depth)) != (*c == '}'))
		j->broken = true;
	else
		j->depth--;
	put(j, c);
}

void gdr_json_object_begin(struct gdr_json *j)
{
	container_open(j, "{");
}

void gdr_json_object_end(struct gdr_json *j)
{
	container_close(j, "}");
}

void gdr_json_array_begin(struct gdr_json *j)
{
	container_open(j, "[");
}

void gdr_json_array_end(struct gdr_json *j)
{
	container_close(j, "]");
}

static void put_quoted(struct gdr_json *j, const char *s)
{
	size_t room = j->len < j->cap ? j->cap - j->len : 0;

	j->len += gdr_json_quote(room ? j->p + j->len : NULL, room, s);
}

void gdr_json_key(struct gdr_json *j, const char *key)
{
	sep(j);
	put_quoted(j, key);
	put(j, ": ");
	j->after_key = true;
}

void gdr_json_str(struct gdr_json *j, const char *s)
{
	sep(j);
	put_quoted(j, s);
}

void gdr_json_u64(struct gdr_json *j, uint64_t v)
{
	char num[24];

	sep(j);
	snprintf(num, sizeof(num), "%" PRIu64, v);
	put(j, num);
}

void gdr_json_i64(struct gdr_json *j, int64_t v)
{
	char num[24];

	sep(j);
	snprintf(num, sizeof(num), "%" PRId64, v);
	put(j, num);
}

void gdr_json_bool(struct gdr_json *j, bool v)
{
	sep(j);
	put(j, v ? "true" : "false");
}
