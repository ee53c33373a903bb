/* The picture `spconv run` writes: two panels side by side over the network's x, y range, seen
 * from above with x to the right and y up (row 0 is the largest y):
 *  - left: the network's output as a heat map of feature norms, the bird's-eye view of the last
 *    tensor (for a dense BEV map [B, C*D, H, W] the norm over all C*D channels of each cell; for
 *    a sparse output the largest norm over the sites stacked in z above each cell);
 *  - right: the occupancy of the input points in the network's range, log(1 + points) per pixel.
 * Pixels without a site or a point are the dark background; the heat scale runs from 0 to the
 * 95th percentile of the panel's values (brighter is larger). Each panel is ceil(H / f) x
 * ceil(W / f) pixels for the network's input grid H x W (y, x) with f = ceil(max(H, W) /
 * PICTURE_PANEL_SIDE), so a pixel is f x f input voxels; the margin is PICTURE_MARGIN pixels. */
#ifndef SPCONV_TOOLS_NET_PICTURE_H
#define SPCONV_TOOLS_NET_PICTURE_H

#include <stdint.h>

#include "spconv/spconv.h"

#define PICTURE_PANEL_SIDE 800
#define PICTURE_MARGIN 8

/** Height and width in pixels of each panel for the network input @p zin. */
void picture_panel_size(const spconv_net_input *zin, int64_t *height, int64_t *width);

/**
 * The picture of one run: @p points (float32 [P, F], x, y, z first) is the scan, @p output the
 * network's output (dense [B, C, H, W], or features [N, C] on the sites of @p out_sparse), both
 * in batch 0. *out is owned by the caller (spconv_image_destroy).
 */
spconv_status picture_make(const spconv_net_input *zin, const spconv_tensor *points,
                           const spconv_tensor *output, const spconv_sparse_tensor *out_sparse,
                           spconv_image **out);

#endif /* SPCONV_TOOLS_NET_PICTURE_H */
