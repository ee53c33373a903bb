/* Tokens of the text headers of PCD and PLY files: blank-separated words of one line, which is
 * not NUL-terminated (a header may contain any byte). */
#ifndef SPCONV_IO_POINTCLOUD_TEXT_H
#define SPCONV_IO_POINTCLOUD_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct spconv__span {
    const char *p;
    size_t n;
} spconv__span;

/* White space as C++ streams see it (PCL reads headers with them), except the newline. */
static inline int spconv__is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* The next blank-separated token of [*cur, end); 0 (and an empty token) at the end of the line. */
static inline int spconv__next_token(const char **cur, const char *end, spconv__span *tok) {
    const char *p = *cur;
    while (p < end && spconv__is_blank(*p)) ++p;
    *tok = (spconv__span){p, 0};
    if (p == end) return 0;
    tok->p = p;
    while (p < end && !spconv__is_blank(*p)) ++p;
    tok->n = (size_t)(p - tok->p);
    *cur = p;
    return 1;
}

static inline int spconv__count_tokens(const char *cur, const char *end) {
    spconv__span tok;
    int n = 0;
    while (spconv__next_token(&cur, end, &tok)) ++n;
    return n;
}

static inline int spconv__span_is(spconv__span t, const char *word) {
    return t.n == strlen(word) && memcmp(t.p, word, t.n) == 0;
}

/* A decimal number without sign in [0, max]. */
static inline int spconv__span_u64(spconv__span t, uint64_t max, uint64_t *out) {
    if (t.n == 0 || t.n > 20) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < t.n; ++i) {
        if (t.p[i] < '0' || t.p[i] > '9') return 0;
        unsigned digit = (unsigned)(t.p[i] - '0');
        if (v > (max - digit) / 10) return 0;
        v = v * 10 + digit;
    }
    *out = v;
    return 1;
}

/* The line, shortened to fit @p size bytes with "..." and unprintable bytes as '?', for
 * messages. */
static inline void spconv__quote_line(spconv__span line, char *buf, size_t size) {
    size_t room = size - 4, n = line.n < room ? line.n : room;
    for (size_t i = 0; i < n; ++i) {
        unsigned char c = (unsigned char)line.p[i];
        buf[i] = c >= 32 && c < 127 ? (char)c : '?';
    }
    memcpy(buf + n, line.n > n ? "..." : "", line.n > n ? 4 : 1);
}

/* Split the next line off [*pos, len): the line without its "\n" (a "\r" before it stays, as in
 * std::getline, and counts as white space); 0 at the end. */
static inline int spconv__next_line(const char *text, size_t len, size_t *pos, spconv__span *line) {
    if (*pos >= len) return 0;
    const char *start = text + *pos;
    const char *nl = memchr(start, '\n', len - *pos);
    size_t n = nl != NULL ? (size_t)(nl - start) : len - *pos;
    *pos += n + (nl != NULL);
    *line = (spconv__span){start, n};
    return 1;
}

#endif /* SPCONV_IO_POINTCLOUD_TEXT_H */
