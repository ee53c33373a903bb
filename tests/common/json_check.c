/* The JSON syntax check (see json_check.h): a recursive-descent recogniser. */
#include "common/json_check.h"

#include <string.h>

#define MAX_DEPTH 64

typedef struct cursor {
    const char *at;
    int depth;
} cursor;

static int value(cursor *c);

static void skip_space(cursor *c) {
    while (*c->at == ' ' || *c->at == '\t' || *c->at == '\n' || *c->at == '\r') ++c->at;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static int is_hex(char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

static int string(cursor *c) {
    if (*c->at != '"') return 0;
    for (++c->at; *c->at != '"'; ++c->at) {
        if ((unsigned char)*c->at < 0x20) return 0; /* also the end of the text */
        if (*c->at != '\\') continue;
        ++c->at;
        if (*c->at == 'u') {
            for (int i = 1; i <= 4; ++i)
                if (!is_hex(c->at[i])) return 0;
            c->at += 4;
        } else if (*c->at == '\0' || strchr("\"\\/bfnrt", *c->at) == NULL) {
            return 0;
        }
    }
    ++c->at;
    return 1;
}

/* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static int number(cursor *c) {
    if (*c->at == '-') ++c->at;
    if (*c->at == '0') ++c->at;
    else if (is_digit(*c->at)) while (is_digit(*c->at)) ++c->at;
    else return 0;
    if (*c->at == '.') {
        if (!is_digit(*++c->at)) return 0;
        while (is_digit(*c->at)) ++c->at;
    }
    if (*c->at == 'e' || *c->at == 'E') {
        ++c->at;
        if (*c->at == '+' || *c->at == '-') ++c->at;
        if (!is_digit(*c->at)) return 0;
        while (is_digit(*c->at)) ++c->at;
    }
    return 1;
}

static int literal(cursor *c, const char *word) {
    size_t n = strlen(word);
    if (strncmp(c->at, word, n) != 0) return 0;
    c->at += n;
    return 1;
}

/* Members of an object (@p object) or elements of an array, after the opening bracket. */
static int container(cursor *c, int object) {
    const char close = object ? '}' : ']';
    if (++c->depth > MAX_DEPTH) return 0;
    ++c->at;
    skip_space(c);
    if (*c->at == close) {
        ++c->at;
        --c->depth;
        return 1;
    }
    for (;;) {
        skip_space(c);
        if (object) {
            if (!string(c)) return 0;
            skip_space(c);
            if (*c->at++ != ':') return 0;
        }
        if (!value(c)) return 0;
        skip_space(c);
        if (*c->at == ',') {
            ++c->at;
            continue;
        }
        if (*c->at++ != close) return 0;
        --c->depth;
        return 1;
    }
}

static int value(cursor *c) {
    skip_space(c);
    switch (*c->at) {
    case '{': return container(c, 1);
    case '[': return container(c, 0);
    case '"': return string(c);
    case 't': return literal(c, "true");
    case 'f': return literal(c, "false");
    case 'n': return literal(c, "null");
    default: return number(c);
    }
}

int spconv_test_json_valid(const char *text, size_t *error_at) {
    cursor c = {text, 0};
    int ok = value(&c);
    if (ok) {
        skip_space(&c);
        ok = *c.at == '\0';
    }
    *error_at = ok ? 0 : (size_t)(c.at - text);
    return ok;
}
