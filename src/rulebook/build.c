/* spconv_rulebook_build: validation of the arguments and rows, then the kind's builder. */
#include <stddef.h>

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "rulebook/build.h"
#include "rulebook/site_lines.h"
#include "spconv/tensor.h"

static spconv_status check_arguments(const char *func, const spconv_tensor *indices,
                                     const int64_t spatial_shape[3], int64_t batch_size,
                                     const spconv_conv_params *params, int64_t out_shape[3]) {
    SPCONV_CHECK_NOT_NULL(func, indices);
    SPCONV_CHECK_NOT_NULL(func, spatial_shape);
    SPCONV_CHECK_NOT_NULL(func, params);
    SPCONV_FORWARD_IF_ERROR(spconv__conv_geometry(func, params, spatial_shape, out_shape));
    SPCONV_FORWARD_IF_ERROR(spconv__check_batch_size(func, batch_size));
    /* Both key layouts up front, so that no work is done for a geometry whose keys cannot be
     * formed, and so that such a geometry fails whatever the rows (a builder that validates the
     * rows from its sorted candidates forms no input keys). The site table and the line index
     * ask the same of the input layout, with the same message. */
    spconv__key_layout layout;
    SPCONV_FORWARD_IF_ERROR(spconv__key_layout_checked(func, "output", batch_size, out_shape, &layout));
    return spconv__key_layout_checked(func, "input", batch_size, spatial_shape, &layout);
}

spconv_status spconv_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                    const int64_t spatial_shape[3], int64_t batch_size,
                                    const spconv_conv_params *params, spconv_rulebook **out) {
    const char *func = "spconv_rulebook_build";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    int64_t out_shape[3];
    SPCONV_FORWARD_IF_ERROR(
        check_arguments(func, indices, spatial_shape, batch_size, params, out_shape));
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, spconv_tensor_device(indices), rulebook_build, "rulebook build",
                    &backend);
    return backend->rulebook_build(ctx, indices, spatial_shape, batch_size, params, out);
}

spconv_status spconv_rulebook_build_on(spconv_context *ctx, const spconv_rulebook *source,
                                       int output_side, const spconv_conv_params *params,
                                       spconv_rulebook **out) {
    const char *func = "spconv_rulebook_build_on";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, source);
    SPCONV_RETURN_ERROR_IF(output_side != 0 && output_side != 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: output_side is %d; 0 takes the source's input sites, 1 its "
                           "output sites",
                           func, output_side);
    return spconv__rulebook_build_sites(
        ctx, output_side ? source->out_indices : source->in_indices,
        output_side ? source->out_shape : source->in_shape, source->batch_size, params, 1, out);
}

/* Rows in range and unique, with the site table's messages (sites.h): through a line index
 * when the grid's lines are few next to the rows, else through the table. */
spconv_status spconv__validate_rows(const spconv__build_input *in) {
    if (in->num_in > 0 && spconv__site_lines_fit(in->num_in, in->batch_size, in->shape)) {
        spconv__site_lines lines;
        SPCONV_FORWARD_IF_ERROR(spconv__site_lines_build(in->func, in->num_threads, in->rows,
                                                         in->num_in, in->batch_size, in->shape,
                                                         &lines));
        spconv__site_lines_free(&lines);
        return SPCONV_OK;
    }
    spconv__site_table sites;
    SPCONV_FORWARD_IF_ERROR(spconv__site_table_build(in->func, in->num_threads, in->rows,
                                                     in->num_in, in->shape, in->batch_size,
                                                     &sites));
    spconv__site_table_free(&sites);
    return SPCONV_OK;
}

/* spconv__cpu_rulebook_build, told whether the rows are known valid. */
static spconv_status cpu_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                        const int64_t spatial_shape[3], int64_t batch_size,
                                        const spconv_conv_params *params, int rows_valid,
                                        spconv_rulebook **out) {
    const char *func = "spconv_rulebook_build";
    int64_t out_shape[3];
    SPCONV_FORWARD_IF_ERROR(spconv__conv_geometry(func, params, spatial_shape, out_shape));
    spconv_tensor *rows;
    SPCONV_FORWARD_IF_ERROR(
        spconv__indices_contiguous(ctx, func, indices, SPCONV_DEVICE_CPU, &rows));
    spconv_rulebook *rb;
    spconv_status st =
        spconv__rulebook_alloc(func, params, spatial_shape, out_shape, batch_size, &rb);
    if (st != SPCONV_OK) {
        spconv_tensor_release(rows);
        return st;
    }
    rb->in_indices = rows; /* the rulebook now owns the reference */
    rb->num_in = spconv_tensor_size(rows, 0);

    spconv__build_input in = {func,         spconv_context_num_threads(ctx),
                              spconv_tensor_data(rows), rb->num_in,
                              NULL,         spatial_shape,
                              batch_size,   rows_valid};
    if (params->kind == SPCONV_CONV_SUBM) {
        st = spconv__build_subm(&in, rb); /* validates the rows its own way */
    } else {
        st = spconv__build_strided(&in, rb); /* validates the rows too */
    }
    if (st != SPCONV_OK) goto fail;
    rb->rows_order[SPCONV__SIDE_OUT] = SPCONV__ORDER_SORTED; /* how both builds list pairs */
    *out = rb;
    return SPCONV_OK;
fail:
    spconv_rulebook_release(rb);
    return st;
}

/* The CPU backend's slot: arguments checked by the entry point; the rows are validated while the
 * site table (or, for subm, the line index) is built. */
spconv_status spconv__cpu_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                         const int64_t spatial_shape[3], int64_t batch_size,
                                         const spconv_conv_params *params,
                                         spconv_rulebook **out) {
    return cpu_rulebook_build(ctx, indices, spatial_shape, batch_size, params, 0, out);
}

spconv_status spconv__rulebook_build_sites(spconv_context *ctx, const spconv_tensor *indices,
                                           const int64_t spatial_shape[3], int64_t batch_size,
                                           const spconv_conv_params *params, int rows_valid,
                                           spconv_rulebook **out) {
    if (!rows_valid || indices == NULL ||
        spconv_tensor_device(indices).type != SPCONV_DEVICE_CPU)
        return spconv_rulebook_build(ctx, indices, spatial_shape, batch_size, params, out);
    const char *func = "spconv_rulebook_build";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    int64_t out_shape[3];
    SPCONV_FORWARD_IF_ERROR(
        check_arguments(func, indices, spatial_shape, batch_size, params, out_shape));
    return cpu_rulebook_build(ctx, indices, spatial_shape, batch_size, params, 1, out);
}
