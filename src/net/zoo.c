/* Model zoo lookup: names, summaries, expected inputs, and building a network from its table. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "net/zoo.h"

static const spconv__zoo_entry *const zoo[] = {&spconv__zoo_second, &spconv__zoo_basic,
                                               &spconv__zoo_unet};
#define ZOO_COUNT ((int)(sizeof zoo / sizeof zoo[0]))

int spconv_zoo_count(void) { return ZOO_COUNT; }

const char *spconv_zoo_name(int index) {
    return index >= 0 && index < ZOO_COUNT ? zoo[index]->name : NULL;
}

const char *spconv_zoo_summary(int index) {
    return index >= 0 && index < ZOO_COUNT ? zoo[index]->summary : NULL;
}

static spconv_status find_entry(const char *func, const char *name, const spconv__zoo_entry **out) {
    SPCONV_CHECK_NOT_NULL(func, name);
    for (int i = 0; i < ZOO_COUNT; ++i)
        if (strcmp(zoo[i]->name, name) == 0) {
            *out = zoo[i];
            return SPCONV_OK;
        }
    char known[128] = "";
    for (int i = 0; i < ZOO_COUNT; ++i)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i > 0 ? ", " : "",
                 zoo[i]->name);
    SPCONV_RETURN_ERROR(SPCONV_ERR_NOT_FOUND, "%s: no zoo network is called '%s' (known: %s)", func,
                        name, known);
}

spconv_status spconv_zoo_input(const char *name, spconv_net_input *out) {
    static const char func[] = "spconv_zoo_input";
    SPCONV_CHECK_NOT_NULL(func, out);
    const spconv__zoo_entry *entry = NULL;
    SPCONV_FORWARD_IF_ERROR(find_entry(func, name, &entry));
    *out = entry->input;
    return SPCONV_OK;
}

spconv_status spconv_zoo_create(const char *name, spconv_dtype dtype, uint64_t seed,
                                spconv_net **out) {
    static const char func[] = "spconv_zoo_create";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    const spconv__zoo_entry *entry = NULL;
    SPCONV_FORWARD_IF_ERROR(find_entry(func, name, &entry));
    return spconv_net_create(dtype, entry->input.channels, entry->layers, entry->num_layers, seed,
                             out);
}
