/* "unet": a small submanifold U-Net in the shape of OpenPCDet's UNetV2 and MinkUNet, for
 * per-voxel outputs (segmentation): three resolutions with 16, 32 and 64 channels.
 *
 * Encoder: submanifold blocks and stride-2 sparse convs (keys spconv2, spconv3); the tensor of
 * each level is saved (x1, x2) before going down. Decoder: inverse convs by those keys bring the
 * features back to exactly the sites of the level above, the saved tensor is concatenated
 * (current channels first, then the skip's), and a submanifold block with that level's key
 * (its rulebook is reused from the encoder) mixes them. A 1x1 submanifold conv with bias is the
 * head. Output: 16 channels on the input sites, in their order. */
#include "net/zoo.h"

#define UP_BLOCK(prefix, cin, cout, key_)                                                          \
    {.kind = SPCONV_LAYER_INVERSE, .name = prefix ".0", .in_channels = (cin),                      \
     .out_channels = (cout), .kernel = {3, 3, 3}, .key = (key_)},                                  \
        SPCONV__ZOO_BN(prefix ".1", cout), SPCONV__ZOO_RELU(prefix ".2")
#define SAVE(nm, key_) {.kind = SPCONV_LAYER_SAVE, .name = (nm), .key = (key_)}
#define CONCAT(nm, key_) {.kind = SPCONV_LAYER_CONCAT, .name = (nm), .key = (key_)}

static const spconv_layer_desc unet_layers[] = {
    SPCONV__ZOO_SUBM_BLOCK("conv_input", 4, 16, "subm1"),
    SAVE("skip1", "x1"),
    SPCONV__ZOO_DOWN_BLOCK("conv2.0", 16, 32, 1, "spconv2"),
    SPCONV__ZOO_SUBM_BLOCK("conv2.1", 32, 32, "subm2"),
    SAVE("skip2", "x2"),
    SPCONV__ZOO_DOWN_BLOCK("conv3.0", 32, 64, 1, "spconv3"),
    SPCONV__ZOO_SUBM_BLOCK("conv3.1", 64, 64, "subm3"),
    UP_BLOCK("up3", 64, 32, "spconv3"),
    CONCAT("cat2", "x2"),
    SPCONV__ZOO_SUBM_BLOCK("dec2", 64, 32, "subm2"),
    UP_BLOCK("up2", 32, 16, "spconv2"),
    CONCAT("cat1", "x1"),
    SPCONV__ZOO_SUBM_BLOCK("dec1", 32, 16, "subm1"),
    {.kind = SPCONV_LAYER_SUBM, .name = "head", .in_channels = 16, .out_channels = 16,
     .kernel = {1, 1, 1}, .bias = 1},
};

/* The KITTI grid and voxelization of "second", so the two run on the same input. */
const spconv__zoo_entry spconv__zoo_unet = {
    .name = "unet",
    .summary = "small submanifold U-Net (16/32/64 channels, inverse convs, skip concatenation) "
               "on the KITTI grid: 4 -> 16 channels per input voxel",
    .input = SPCONV__ZOO_KITTI_INPUT,
    .layers = unet_layers,
    .num_layers = (int)(sizeof unet_layers / sizeof unet_layers[0]),
};
