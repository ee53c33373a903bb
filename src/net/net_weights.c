/* Parameters: allocation with the seeded initialisation, loading from and saving to a folder of
 * .npy files (one per parameter), and the SGD step. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conv/conv_check.h"
#include "core/error.h"
#include "net/net_internal.h"
#include "tensor/convert.h"
#include "tensor/tensor_impl.h"
#include "spconv/npy.h"

/* ---- seeded initialisation ------------------------------------------------------------------- */

/* splitmix64: a stream per parameter, seeded by (seed, name), so adding a layer does not change
 * the values of the others. */
typedef struct init_rng {
    uint64_t state;
} init_rng;

static uint64_t rng_next(init_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static init_rng rng_for(uint64_t seed, const char *name) {
    uint64_t hash = 0xCBF29CE484222325u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; ++p)
        hash = (hash ^ *p) * 0x100000001B3u;
    init_rng rng = {seed ^ hash};
    return rng;
}

/* Fill @p t with U(-bound, bound) (bound > 0) or with the constant @p value (bound == 0). */
static void fill_param(spconv_tensor *t, uint64_t seed, const char *name, double bound,
                       double value) {
    init_rng rng = rng_for(seed, name);
    const int64_t n = spconv_tensor_numel(t);
    const spconv_dtype dtype = spconv_tensor_dtype(t);
    const size_t size = spconv_dtype_size(dtype);
    char *data = spconv_tensor_data(t);
    for (int64_t i = 0; i < n; ++i) {
        double v = value;
        if (bound > 0.0) v = bound * (2.0 * ((double)(rng_next(&rng) >> 11) * 0x1.0p-53) - 1.0);
        /* rounded to nearest even (the 16-bit dtypes through f32, as convert.h's rules say) */
        spconv__store_from_floating(data + (size_t)i * size, dtype, v);
    }
}

/* Append parameter "<layer>.<suffix>" of @p ndim sizes, initialised by fill_param. */
static spconv_status add_param(spconv_net *net, const spconv__net_layer *layer, const char *suffix,
                               int ndim, const int64_t *sizes, int trainable, uint64_t seed,
                               double bound, double value) {
    static const char func[] = "spconv_net_create";
    spconv__net_param *p = &net->params[net->num_params];
    size_t length = strlen(layer->desc.name) + 1 + strlen(suffix) + 1;
    p->name = malloc(length);
    SPCONV_RETURN_ERROR_IF(p->name == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for parameter names", func);
    snprintf(p->name, length, "%s.%s", layer->desc.name, suffix);
    ++net->num_params;
    p->trainable = trainable;
    SPCONV_FORWARD_IF_ERROR(spconv__tensor_empty_in(func, NULL, spconv_cpu(),
                                                    spconv__net_param_dtype(net, layer->desc.kind),
                                                    ndim, sizes, &p->value));
    fill_param(p->value, seed, p->name, bound, value);
    return SPCONV_OK;
}

static spconv_status init_layer_params(spconv_net *net, spconv__net_layer *layer, uint64_t seed) {
    const spconv_layer_desc *d = &layer->desc;
    layer->first_param = net->num_params;
    if (d->kind == SPCONV_LAYER_BATCHNORM) {
        const int64_t c = d->in_channels;
        SPCONV_FORWARD_IF_ERROR(add_param(net, layer, "weight", 1, &c, 1, seed, 0.0, 1.0));
        SPCONV_FORWARD_IF_ERROR(add_param(net, layer, "bias", 1, &c, 1, seed, 0.0, 0.0));
        SPCONV_FORWARD_IF_ERROR(add_param(net, layer, "running_mean", 1, &c, 0, seed, 0.0, 0.0));
        SPCONV_FORWARD_IF_ERROR(add_param(net, layer, "running_var", 1, &c, 0, seed, 0.0, 1.0));
    } else if (spconv__layer_is_conv(d->kind)) {
        const int64_t kv = spconv_conv_kernel_volume(&layer->params);
        const int64_t sizes[3] = {kv, d->in_channels, d->out_channels};
        const double fan_in = (double)kv * (double)d->in_channels; /* no int64 product */
        /* Kaiming-uniform for ReLU (gain sqrt 2); biases as PyTorch's conv default. */
        SPCONV_FORWARD_IF_ERROR(
            add_param(net, layer, "weight", 3, sizes, 1, seed, sqrt(6.0 / fan_in), 0.0));
        if (d->bias)
            SPCONV_FORWARD_IF_ERROR(add_param(net, layer, "bias", 1, &d->out_channels, 1, seed,
                                              1.0 / sqrt(fan_in), 0.0));
    }
    layer->num_params = net->num_params - layer->first_param;
    return SPCONV_OK;
}

spconv_status spconv__net_init_params(spconv_net *net, uint64_t seed) {
    /* At most four per layer (batch norm). */
    net->params = calloc((size_t)net->num_layers * 4, sizeof *net->params);
    SPCONV_RETURN_ERROR_IF(net->params == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "spconv_net_create: out of host memory for parameters");
    for (int i = 0; i < net->num_layers; ++i)
        SPCONV_FORWARD_IF_ERROR(init_layer_params(net, &net->layers[i], seed));
    return SPCONV_OK;
}

/* Prefix the current error message with "func: parameter 'name': " (copied out first: the
 * message lives in the buffer that spconv__error writes). */
static spconv_status param_error(spconv_status status, const char *func, const char *name) {
    char inner[768];
    snprintf(inner, sizeof inner, "%s", spconv_last_error());
    return spconv__error(status, "%s: parameter '%s': %s", func, name, inner);
}

/* ---- file names and shapes in messages ------------------------------------------------------- */

static char *param_path(const char *dir, const char *name) {
    size_t length = strlen(dir) + 1 + strlen(name) + 5;
    char *path = malloc(length);
    if (path != NULL) snprintf(path, length, "%s/%s.npy", dir, name);
    return path;
}

/* The parameter's layer: conv weights need the kernel for layout conversions. */
static const spconv__net_layer *param_layer(const spconv_net *net, int index) {
    for (int i = 0; i < net->num_layers; ++i) {
        const spconv__net_layer *layer = &net->layers[i];
        if (index >= layer->first_param && index < layer->first_param + layer->num_params)
            return layer;
    }
    return NULL;
}

static int is_conv_weight(const spconv_net *net, int index) {
    const spconv__net_layer *layer = param_layer(net, index);
    return spconv__layer_is_conv(layer->desc.kind) && index == layer->first_param;
}

/* ---- loading --------------------------------------------------------------------------------- */

static int same_sizes(const spconv_tensor *t, int ndim, const int64_t *sizes) {
    if (spconv_tensor_ndim(t) != ndim) return 0;
    for (int i = 0; i < ndim; ++i)
        if (spconv_tensor_size(t, i) != sizes[i]) return 0;
    return 1;
}

/* Which layout a 5-d conv weight file is in, or -1 when its shape fits none that @p requested
 * allows. */
static int weight_layout_of(const spconv_tensor *t, const spconv__net_layer *layer,
                            spconv_net_layout requested) {
    const spconv_layer_desc *d = &layer->desc;
    const int64_t *k = layer->params.kernel;
    const int64_t krsc[5] = {d->out_channels, k[0], k[1], k[2], d->in_channels};
    const int64_t rsck[5] = {k[0], k[1], k[2], d->in_channels, d->out_channels};
    const int64_t oidhw[5] = {d->out_channels, d->in_channels, k[0], k[1], k[2]};
    int is_auto = requested == SPCONV_NET_LAYOUT_AUTO;
    if ((is_auto || requested == SPCONV_NET_LAYOUT_KRSC) && same_sizes(t, 5, krsc))
        return SPCONV_WEIGHT_KRSC;
    if ((is_auto || requested == SPCONV_NET_LAYOUT_RSCK) && same_sizes(t, 5, rsck))
        return SPCONV_WEIGHT_RSCK;
    if (requested == SPCONV_NET_LAYOUT_OIDHW && same_sizes(t, 5, oidhw)) return SPCONV_WEIGHT_OIDHW;
    return -1;
}

/* The shapes a conv weight file may have in the layout asked for, and only those: naming a
 * layout the user did not choose would send them to the wrong fix. */
static spconv_status weight_shape_error(const char *func, const spconv__net_param *param,
                                        const spconv__net_layer *layer, const spconv_tensor *file,
                                        spconv_net_layout layout) {
    const spconv_layer_desc *d = &layer->desc;
    const int64_t *k = layer->params.kernel, ci = d->in_channels, co = d->out_channels;
    char rsck5[128], krsc[128], oidhw[128];
    snprintf(rsck5, sizeof rsck5, "[KD, KH, KW, C_in, C_out] = [%" PRId64 ", %" PRId64 ", %" PRId64
             ", %" PRId64 ", %" PRId64 "]", k[0], k[1], k[2], ci, co);
    snprintf(krsc, sizeof krsc, "KRSC [C_out, KD, KH, KW, C_in] = [%" PRId64 ", %" PRId64 ", %"
             PRId64 ", %" PRId64 ", %" PRId64 "]", co, k[0], k[1], k[2], ci);
    snprintf(oidhw, sizeof oidhw, "OIDHW [C_out, C_in, KD, KH, KW] = [%" PRId64 ", %" PRId64 ", %"
             PRId64 ", %" PRId64 ", %" PRId64 "]", co, ci, k[0], k[1], k[2]);
    /* Kept whole: .text of the returned temporary would not outlive this statement. */
    const spconv__conv_text rsck3 = spconv__shape_text(param->value);
    char needs[512];
    switch (layout) {
    case SPCONV_NET_LAYOUT_RSCK:
        snprintf(needs, sizeof needs, "RSCK %s or %s (the layout asked for)", rsck3.text, rsck5);
        break;
    case SPCONV_NET_LAYOUT_KRSC:
        snprintf(needs, sizeof needs, "%s (the layout asked for)", krsc);
        break;
    case SPCONV_NET_LAYOUT_OIDHW:
        snprintf(needs, sizeof needs, "%s (the layout asked for)", oidhw);
        break;
    default: snprintf(needs, sizeof needs, "RSCK %s or %s, or %s", rsck3.text, rsck5, krsc); break;
    }
    SPCONV_RETURN_ERROR(SPCONV_ERR_SHAPE_MISMATCH,
                        "%s: parameter '%s' has shape %s, but layer '%s' needs %s", func,
                        param->name, spconv__shape_text(file).text, d->name, needs);
}

/* A conv weight file in RSCK [KV, C_in, C_out] (*out: a new reference). */
static spconv_status conv_weight_to_rsck(spconv_context *ctx, const char *func,
                                         const spconv__net_param *param,
                                         const spconv__net_layer *layer, spconv_tensor *file,
                                         spconv_net_layout layout, spconv_tensor **out) {
    const int64_t *want = spconv_tensor_sizes(param->value);
    int three_d_ok = layout == SPCONV_NET_LAYOUT_AUTO || layout == SPCONV_NET_LAYOUT_RSCK;
    if (three_d_ok && same_sizes(file, 3, want)) {
        spconv_tensor_retain(file);
        *out = file;
        return SPCONV_OK;
    }
    int found = spconv_tensor_ndim(file) == 5 ? weight_layout_of(file, layer, layout) : -1;
    if (found == SPCONV_WEIGHT_RSCK) return spconv_tensor_view(file, 3, want, out);
    if (found >= 0) {
        spconv_status st = spconv_weight_to_rsck(ctx, file, (spconv_weight_layout)found, NULL, out);
        return st == SPCONV_OK ? st : param_error(st, func, param->name);
    }
    return weight_shape_error(func, param, layer, file, layout);
}

/* A finite value of the file that became infinite in the parameter's dtype (65504 is f16's
 * largest) is an error naming it, not a silent inf. Both tensors are contiguous CPU tensors
 * of the same numel (the second converted from the first). */
static spconv_status check_fits(const char *func, const char *name, const char *path,
                                const spconv_tensor *file, const spconv_tensor *converted) {
    const spconv_dtype from = spconv_tensor_dtype(file), to = spconv_tensor_dtype(converted);
    if (from == to) return SPCONV_OK;
    const size_t from_size = spconv_dtype_size(from), to_size = spconv_dtype_size(to);
    const char *a = spconv_tensor_data(file), *b = spconv_tensor_data(converted);
    for (int64_t i = 0; i < spconv_tensor_numel(file); ++i) {
        const double v = spconv__load_floating(a + (size_t)i * from_size, from);
        if (isfinite(v) && !isfinite(spconv__load_floating(b + (size_t)i * to_size, to)))
            return spconv__error(SPCONV_ERR_OUT_OF_RANGE,
                                 "%s: parameter '%s' in '%s': element %" PRId64 " = %g does not "
                                 "fit %s (it would become infinite)",
                                 func, name, path, i, v, spconv_dtype_name(to));
    }
    return SPCONV_OK;
}

/* Read one parameter's file, check it and convert it to the parameter's dtype and layout. */
static spconv_status load_param(spconv_context *ctx, const spconv_net *net, int index,
                                const char *dir, spconv_net_layout layout, spconv_tensor **out) {
    static const char func[] = "spconv_net_load_weights";
    const spconv__net_param *param = &net->params[index];
    char *path = param_path(dir, param->name);
    SPCONV_RETURN_ERROR_IF(path == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory", func);
    struct stat info;
    spconv_status st = SPCONV_OK;
    spconv_tensor *file = NULL, *converted = NULL;
    if (stat(path, &info) != 0 && errno == ENOENT)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_NOT_FOUND, "%s: parameter '%s' has no file '%s'",
                         func, param->name, path);
    st = spconv_npy_read(path, &file);
    if (st != SPCONV_OK) {
        st = param_error(st, func, param->name);
        goto done;
    }
    if (!spconv_dtype_is_floating(spconv_tensor_dtype(file)))
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_DTYPE_MISMATCH,
                         "%s: parameter '%s' in '%s' holds %s values, not floating point", func,
                         param->name, path, spconv_dtype_name(spconv_tensor_dtype(file)));
    SPCONV_TRY_GOTO(st,
                    spconv_tensor_to_dtype(ctx, file, spconv_tensor_dtype(param->value), &converted),
                    done);
    SPCONV_TRY_GOTO(st, check_fits(func, param->name, path, file, converted), done);
    if (is_conv_weight(net, index)) {
        st = conv_weight_to_rsck(ctx, func, param, param_layer(net, index), converted, layout, out);
    } else if (same_sizes(converted, 1, spconv_tensor_sizes(param->value))) {
        spconv_tensor_retain(converted);
        *out = converted;
    } else {
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_SHAPE_MISMATCH,
                         "%s: parameter '%s' has shape %s, but the network needs %s", func,
                         param->name, spconv__shape_text(file).text,
                         spconv__shape_text(param->value).text);
    }
done:
    spconv_tensor_release(converted);
    spconv_tensor_release(file);
    free(path);
    return st;
}

spconv_status spconv_net_load_weights(spconv_context *ctx, spconv_net *net, const char *dir,
                                      spconv_net_layout layout) {
    static const char func[] = "spconv_net_load_weights";
    SPCONV_CHECK_NOT_NULL(func, net);
    SPCONV_CHECK_NOT_NULL(func, dir);
    SPCONV_RETURN_ERROR_IF(layout < SPCONV_NET_LAYOUT_AUTO || layout > SPCONV_NET_LAYOUT_OIDHW,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: layout %d is not a weight layout",
                           func, (int)layout);
    /* Stage every tensor first, so that a failure leaves the network as it was. */
    spconv_tensor **staged = calloc((size_t)net->num_params + 1, sizeof *staged);
    SPCONV_RETURN_ERROR_IF(staged == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory",
                           func);
    spconv_status st = SPCONV_OK;
    for (int i = 0; i < net->num_params && st == SPCONV_OK; ++i)
        st = load_param(ctx, net, i, dir, layout, &staged[i]);
    for (int i = 0; i < net->num_params; ++i) {
        if (st == SPCONV_OK) {
            /* Parameters stay contiguous tensors that the network owns alone. */
            st = spconv_tensor_copy_(ctx, net->params[i].value, staged[i]);
        }
        spconv_tensor_release(staged[i]);
    }
    free(staged);
    net->param_version++; /* even a failed copy may have changed some */
    return st;
}

/* ---- saving ---------------------------------------------------------------------------------- */

static spconv_status make_dir(const char *func, const char *dir) {
    struct stat info;
    if (stat(dir, &info) == 0) {
        SPCONV_RETURN_ERROR_IF(!S_ISDIR(info.st_mode), SPCONV_ERR_IO,
                               "%s: '%s' exists and is not a folder", func, dir);
        return SPCONV_OK;
    }
    SPCONV_RETURN_ERROR_IF(mkdir(dir, 0777) != 0, SPCONV_ERR_IO,
                           "%s: cannot create the folder '%s': %s", func, dir, strerror(errno));
    return SPCONV_OK;
}

static spconv_status save_param(spconv_context *ctx, const spconv_net *net, int index,
                                const char *dir, spconv_net_layout layout) {
    static const char func[] = "spconv_net_save_weights";
    const spconv__net_param *param = &net->params[index];
    spconv_tensor *file = NULL;
    spconv_status st = SPCONV_OK;
    if (is_conv_weight(net, index) && layout >= SPCONV_NET_LAYOUT_KRSC) {
        spconv_weight_layout target =
            layout == SPCONV_NET_LAYOUT_KRSC ? SPCONV_WEIGHT_KRSC : SPCONV_WEIGHT_OIDHW;
        st = spconv_weight_from_rsck(ctx, param->value, param_layer(net, index)->params.kernel,
                                     target, &file);
        if (st != SPCONV_OK) return param_error(st, func, param->name);
    } else {
        spconv_tensor_retain(param->value);
        file = param->value;
    }
    if (spconv_tensor_dtype(file) == SPCONV_BF16) {
        /* .npy has no bf16: the file holds the same values as f32 (exactly) */
        spconv_tensor *wide = NULL;
        st = spconv_tensor_to_dtype(ctx, file, SPCONV_F32, &wide);
        spconv_tensor_release(file);
        file = wide;
        if (st != SPCONV_OK) return param_error(st, func, param->name);
    }
    char *path = param_path(dir, param->name);
    if (path == NULL)
        st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory", func);
    else if ((st = spconv_npy_write(ctx, path, file)) != SPCONV_OK)
        st = param_error(st, func, param->name);
    free(path);
    spconv_tensor_release(file);
    return st;
}

spconv_status spconv_net_save_weights(spconv_context *ctx, const spconv_net *net, const char *dir,
                                      spconv_net_layout layout) {
    static const char func[] = "spconv_net_save_weights";
    SPCONV_CHECK_NOT_NULL(func, net);
    SPCONV_CHECK_NOT_NULL(func, dir);
    SPCONV_RETURN_ERROR_IF(layout < SPCONV_NET_LAYOUT_AUTO || layout > SPCONV_NET_LAYOUT_OIDHW,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: layout %d is not a weight layout",
                           func, (int)layout);
    SPCONV_FORWARD_IF_ERROR(make_dir(func, dir));
    for (int i = 0; i < net->num_params; ++i)
        SPCONV_FORWARD_IF_ERROR(save_param(ctx, net, i, dir, layout));
    return SPCONV_OK;
}

/* ---- SGD ------------------------------------------------------------------------------------- */

spconv_status spconv_net_sgd_step(spconv_context *ctx, spconv_net *net, double learning_rate) {
    static const char func[] = "spconv_net_sgd_step";
    SPCONV_CHECK_NOT_NULL(func, net);
    SPCONV_RETURN_ERROR_IF(!isfinite(learning_rate), SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the learning rate is not finite (%g)", func, learning_rate);
    SPCONV_RETURN_ERROR_IF(!net->has_grads, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: no gradients yet: run spconv_net_backward first", func);
    net->param_version++;
    for (int i = 0; i < net->num_params; ++i)
        if (net->params[i].trainable && net->params[i].grad != NULL)
            SPCONV_FORWARD_IF_ERROR(spconv__net_axpy(ctx, -learning_rate, net->params[i].grad,
                                                     net->params[i].value));
    return SPCONV_OK;
}
