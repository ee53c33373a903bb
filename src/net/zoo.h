/* The model zoo: each network is a table of layers in its own file, registered in zoo.c. */
#ifndef SPCONV_NET_ZOO_H
#define SPCONV_NET_ZOO_H

#include "spconv/net.h"

typedef struct spconv__zoo_entry {
    const char *name;
    const char *summary;
    spconv_net_input input;
    const spconv_layer_desc *layers;
    int num_layers;
} spconv__zoo_entry;

extern const spconv__zoo_entry spconv__zoo_second;
extern const spconv__zoo_entry spconv__zoo_basic;
extern const spconv__zoo_entry spconv__zoo_unet;

/* Layer shorthands for the tables (designated initializers; unnamed fields take defaults). */
#define SPCONV__ZOO_SUBM(nm, cin, cout, k, key_)                                                   \
    {.kind = SPCONV_LAYER_SUBM, .name = (nm), .in_channels = (cin), .out_channels = (cout),        \
     .kernel = {(k), (k), (k)}, .key = (key_)}
#define SPCONV__ZOO_RELU(nm) {.kind = SPCONV_LAYER_RELU, .name = (nm)}

#endif /* SPCONV_NET_ZOO_H */
