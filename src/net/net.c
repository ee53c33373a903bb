/* Networks: creation with every check that does not depend on the input, accessors, and the
 * layer-naming error helper the other files use. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "net/net_internal.h"

#define NAME_MAX_CHARS 127

const char *spconv_layer_kind_name(spconv_layer_kind kind) {
    switch (kind) {
    case SPCONV_LAYER_SUBM: return "subm";
    case SPCONV_LAYER_CONV: return "conv";
    case SPCONV_LAYER_TRANSPOSED: return "transposed";
    case SPCONV_LAYER_INVERSE: return "inverse";
    case SPCONV_LAYER_MAXPOOL: return "maxpool";
    case SPCONV_LAYER_BATCHNORM: return "batchnorm";
    case SPCONV_LAYER_RELU: return "relu";
    case SPCONV_LAYER_TO_DENSE: return "to_dense";
    case SPCONV_LAYER_SAVE: return "save";
    case SPCONV_LAYER_CONCAT: return "concat";
    }
    return "invalid";
}

/* Record "func: layer i 'name' (kind): <message>" and return @p status. */
static spconv_status layer_fail(spconv_status status, const char *func, int index,
                                const spconv_layer_desc *desc, const char *fmt, ...)
    SPCONV_PRINTF_LIKE(5, 6);

static spconv_status layer_fail(spconv_status status, const char *func, int index,
                                const spconv_layer_desc *desc, const char *fmt, ...) {
    char detail[768];
    va_list args;
    va_start(args, fmt);
    vsnprintf(detail, sizeof detail, fmt, args);
    va_end(args);
    const char *name = desc->name != NULL ? desc->name : "";
    return spconv__error(status, "%s: layer %d '%.*s' (%s): %s", func, index, NAME_MAX_CHARS, name,
                         spconv_layer_kind_name(desc->kind), detail);
}

spconv_status spconv__net_layer_error(const char *func, const spconv__net_layer *layer,
                                      spconv_status status) {
    /* The message lives in the buffer that spconv__error writes: copy it out first. */
    char inner[768];
    snprintf(inner, sizeof inner, "%s", spconv_last_error());
    return layer_fail(status, func, layer->stats.index, &layer->desc, "%s", inner);
}

/* ---- checks at creation ---------------------------------------------------------------------- */

static spconv_status check_name(const char *func, const spconv_layer_desc *layers, int index) {
    const spconv_layer_desc *d = &layers[index];
    if (d->name == NULL || d->name[0] == '\0')
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d, "the layer has no name");
    size_t length = strlen(d->name);
    if (length > NAME_MAX_CHARS)
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "the name has %zu characters, more than %d", length, NAME_MAX_CHARS);
    /* Names become file names of parameters: keep them to a portable character set. */
    size_t good = strspn(d->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "0123456789_.-");
    if (good != length)
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "character %zu of the name is not one of [A-Za-z0-9_.-]", good);
    for (int j = 0; j < index; ++j)
        if (strcmp(layers[j].name, d->name) == 0)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "the name is already used by layer %d", j);
    return SPCONV_OK;
}

/* Fill defaults (stride 1, dilation 1) and check the conv/pool geometry values. */
static spconv_status check_geometry(const char *func, int index, spconv_layer_desc *d) {
    static const char axes[3] = {'z', 'y', 'x'};
    for (int a = 0; a < 3; ++a) {
        /* Pooling strides default to the kernel, as in PyTorch and spconv. */
        if (d->stride[a] == 0) d->stride[a] = d->kind == SPCONV_LAYER_MAXPOOL ? d->kernel[a] : 1;
        if (d->dilation[a] == 0) d->dilation[a] = 1;
        if (d->kernel[a] < 1 || d->stride[a] < 1 || d->dilation[a] < 1 || d->padding[a] < 0 ||
            d->output_padding[a] < 0)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "on axis %c kernel %" PRId64 ", stride %" PRId64 ", dilation %" PRId64
                              " must be >= 1 and padding %" PRId64 ", output padding %" PRId64
                              " >= 0",
                              axes[a], d->kernel[a], d->stride[a], d->dilation[a], d->padding[a],
                              d->output_padding[a]);
        const int64_t most = INT32_MAX; /* the rulebook geometry's bound (rulebook.h) */
        if (d->kernel[a] > most || d->stride[a] > most || d->dilation[a] > most ||
            d->padding[a] > most || d->output_padding[a] > most)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "on axis %c kernel %" PRId64 ", stride %" PRId64 ", dilation %" PRId64
                              ", padding %" PRId64 " and output padding %" PRId64
                              " must be at most %" PRId64,
                              axes[a], d->kernel[a], d->stride[a], d->dilation[a], d->padding[a],
                              d->output_padding[a], most);
        if (d->kind == SPCONV_LAYER_SUBM && d->kernel[a] % 2 == 0)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "a submanifold kernel must be odd, but it is %" PRId64 " on axis %c",
                              d->kernel[a], axes[a]);
        int64_t limit = d->stride[a] > d->dilation[a] ? d->stride[a] : d->dilation[a];
        if (d->kind == SPCONV_LAYER_TRANSPOSED && d->output_padding[a] >= limit)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "output padding %" PRId64 " on axis %c must be below max(stride, "
                              "dilation) = %" PRId64,
                              d->output_padding[a], axes[a], limit);
        if (d->kind != SPCONV_LAYER_TRANSPOSED && d->output_padding[a] != 0)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "output padding is for transposed convs only (axis %c: %" PRId64 ")",
                              axes[a], d->output_padding[a]);
    }
    spconv_conv_params sizes = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    memcpy(sizes.kernel, d->kernel, sizeof sizes.kernel);
    if (spconv_conv_kernel_volume(&sizes) > INT32_MAX)
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "kernel (%" PRId64 ", %" PRId64 ", %" PRId64
                          ") has more than %d offsets",
                          d->kernel[0], d->kernel[1], d->kernel[2], INT32_MAX);
    return SPCONV_OK;
}

/* The last earlier layer of one of the kinds @p a / @p b whose key is @p key, or -1. */
static int find_keyed(const spconv__net_layer *layers, int before, const char *key,
                      spconv_layer_kind a, spconv_layer_kind b) {
    for (int j = before - 1; j >= 0; --j) {
        const spconv_layer_desc *d = &layers[j].desc;
        if ((d->kind == a || d->kind == b) && d->key != NULL && strcmp(d->key, key) == 0) return j;
    }
    return -1;
}

/* An INVERSE layer: the CONV or MAXPOOL it inverts, with the same kernel (0 takes that one's). */
static spconv_status check_inverse(const char *func, spconv__net_layer *layers, int index) {
    spconv__net_layer *layer = &layers[index];
    spconv_layer_desc *d = &layer->desc;
    int j = find_keyed(layers, index, d->key, SPCONV_LAYER_CONV, SPCONV_LAYER_MAXPOOL);
    if (j < 0)
        return layer_fail(SPCONV_ERR_NOT_FOUND, func, index, d,
                          "no earlier conv or maxpool layer stores a rulebook under key '%s'",
                          d->key);
    const int64_t *k = layers[j].desc.kernel;
    if (d->kernel[0] == 0 && d->kernel[1] == 0 && d->kernel[2] == 0)
        memcpy(d->kernel, k, sizeof d->kernel);
    if (memcmp(d->kernel, k, sizeof d->kernel) != 0)
        return layer_fail(SPCONV_ERR_GEOMETRY_MISMATCH, func, index, d,
                          "kernel (%" PRId64 ", %" PRId64 ", %" PRId64
                          ") differs from kernel (%" PRId64 ", %" PRId64 ", %" PRId64
                          ") of layer %d '%s' that it inverts by key '%s'",
                          d->kernel[0], d->kernel[1], d->kernel[2], k[0], k[1], k[2], j,
                          layers[j].desc.name, d->key);
    layer->saved_layer = j;
    return SPCONV_OK;
}

/* The channels a layer expects against the channels it gets. */
static spconv_status check_channels(const char *func, const spconv__net_layer *layers, int index,
                                    int64_t expected, int64_t current) {
    const spconv_layer_desc *d = &layers[index].desc;
    if (expected <= 0)
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "in_channels must be > 0 (it is %" PRId64 ")", expected);
    if (expected == current) return SPCONV_OK;
    char source[NAME_MAX_CHARS + 64];
    if (index == 0)
        snprintf(source, sizeof source, "the network input");
    else
        snprintf(source, sizeof source, "layer %d '%s'", index - 1, layers[index - 1].desc.name);
    return layer_fail(SPCONV_ERR_SHAPE_MISMATCH, func, index, d,
                      "expects %" PRId64 " input channels but gets %" PRId64 " from %s", expected,
                      current, source);
}

static spconv_status check_conv(const char *func, spconv__net_layer *layers, int index,
                                int64_t *channels) {
    spconv__net_layer *layer = &layers[index];
    spconv_layer_desc *d = &layer->desc;
    SPCONV_FORWARD_IF_ERROR(check_channels(func, layers, index, d->in_channels, *channels));
    if (d->out_channels <= 0)
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "out_channels must be > 0 (it is %" PRId64 ")", d->out_channels);
    if (d->kind == SPCONV_LAYER_INVERSE) {
        if (d->key == NULL)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "an inverse conv needs the key of the conv it inverts");
        SPCONV_FORWARD_IF_ERROR(check_inverse(func, layers, index));
    }
    SPCONV_FORWARD_IF_ERROR(check_geometry(func, index, d));
    *channels = d->out_channels;
    return SPCONV_OK;
}

static spconv_status check_batchnorm(const char *func, spconv__net_layer *layers, int index,
                                     int64_t channels) {
    spconv_layer_desc *d = &layers[index].desc;
    SPCONV_FORWARD_IF_ERROR(check_channels(func, layers, index, d->in_channels, channels));
    if (d->eps == 0.0) d->eps = 1e-5;
    if (d->momentum == 0.0) d->momentum = 0.1;
    if (!(d->eps > 0.0) || !isfinite(d->eps) || !(d->momentum > 0.0 && d->momentum <= 1.0))
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "eps (%g) must be finite and > 0, momentum (%g) in [0, 1] (0 means 0.1)",
                          d->eps, d->momentum);
    return SPCONV_OK;
}

/* SAVE and CONCAT: the saved name exists (CONCAT) or is new (SAVE). */
static spconv_status check_skip(const char *func, spconv__net_layer *layers, int index,
                                int64_t *channels) {
    spconv__net_layer *layer = &layers[index];
    const spconv_layer_desc *d = &layer->desc;
    if (d->key == NULL || d->key[0] == '\0')
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "needs a key: the name of the saved tensor");
    int j = find_keyed(layers, index, d->key, SPCONV_LAYER_SAVE, SPCONV_LAYER_SAVE);
    if (d->kind == SPCONV_LAYER_SAVE) {
        if (j >= 0)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "layer %d '%s' already saves a tensor under '%s'", j,
                              layers[j].desc.name, d->key);
        return SPCONV_OK;
    }
    if (j < 0)
        return layer_fail(SPCONV_ERR_NOT_FOUND, func, index, d,
                          "no earlier save layer stores a tensor under '%s'", d->key);
    layer->saved_layer = j;
    *channels += layers[j].c_in;
    return SPCONV_OK;
}

/* The rulebook geometry of a conv or pool layer. */
static spconv_conv_kind conv_kind_of(spconv_layer_kind kind) {
    switch (kind) {
    case SPCONV_LAYER_SUBM: return SPCONV_CONV_SUBM;
    case SPCONV_LAYER_TRANSPOSED: return SPCONV_CONV_TRANSPOSED;
    case SPCONV_LAYER_INVERSE: return SPCONV_CONV_INVERSE;
    default: return SPCONV_CONV_REGULAR; /* CONV and MAXPOOL */
    }
}

static spconv_status check_layer(const char *func, spconv__net_layer *layers, int index,
                                 int num_layers, int64_t *channels) {
    spconv__net_layer *layer = &layers[index];
    spconv_layer_desc *d = &layer->desc;
    layer->c_in = *channels;
    layer->saved_layer = -1;
    switch (d->kind) {
    case SPCONV_LAYER_SUBM:
    case SPCONV_LAYER_CONV:
    case SPCONV_LAYER_TRANSPOSED:
    case SPCONV_LAYER_INVERSE:
        SPCONV_FORWARD_IF_ERROR(check_conv(func, layers, index, channels));
        break;
    case SPCONV_LAYER_MAXPOOL: SPCONV_FORWARD_IF_ERROR(check_geometry(func, index, d)); break;
    case SPCONV_LAYER_BATCHNORM:
        SPCONV_FORWARD_IF_ERROR(check_batchnorm(func, layers, index, *channels));
        break;
    case SPCONV_LAYER_RELU: break;
    case SPCONV_LAYER_TO_DENSE:
        if (index != num_layers - 1)
            return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                              "to_dense must be the last layer (the network has %d)", num_layers);
        break;
    case SPCONV_LAYER_SAVE:
    case SPCONV_LAYER_CONCAT:
        SPCONV_FORWARD_IF_ERROR(check_skip(func, layers, index, channels));
        break;
    default:
        return layer_fail(SPCONV_ERR_INVALID_ARGUMENT, func, index, d,
                          "kind %d is not a layer kind", (int)d->kind);
    }
    layer->c_out = *channels;
    if (spconv__layer_is_conv(d->kind) || d->kind == SPCONV_LAYER_MAXPOOL) {
        spconv_conv_params *p = &layer->params;
        p->kind = conv_kind_of(d->kind);
        memcpy(p->kernel, d->kernel, sizeof p->kernel);
        memcpy(p->stride, d->stride, sizeof p->stride);
        memcpy(p->padding, d->padding, sizeof p->padding);
        memcpy(p->dilation, d->dilation, sizeof p->dilation);
        memcpy(p->output_padding, d->output_padding, sizeof p->output_padding);
    }
    return SPCONV_OK;
}

/* ---- creation and destruction ---------------------------------------------------------------- */

static char *copy_string(const char *s) {
    if (s == NULL) return NULL;
    size_t n = strlen(s) + 1;
    char *copy = malloc(n);
    if (copy != NULL) memcpy(copy, s, n);
    return copy;
}

/* Copy the descriptions with their strings, so the caller's table may go away. */
static spconv_status copy_layers(const char *func, spconv_net *net,
                                 const spconv_layer_desc *layers) {
    for (int i = 0; i < net->num_layers; ++i) {
        spconv__net_layer *layer = &net->layers[i];
        layer->desc = layers[i];
        layer->stats.index = i;
        SPCONV_FORWARD_IF_ERROR(check_name(func, layers, i));
        layer->name_owned = copy_string(layers[i].name);
        layer->key_owned = copy_string(layers[i].key);
        SPCONV_RETURN_ERROR_IF(
            layer->name_owned == NULL || (layers[i].key != NULL && layer->key_owned == NULL),
            SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory for layer names", func);
        layer->desc.name = layer->name_owned;
        layer->desc.key = layer->key_owned;
        layer->stats.name = layer->name_owned;
        layer->stats.kind = layer->desc.kind;
    }
    return SPCONV_OK;
}

spconv_status spconv_net_create(spconv_dtype dtype, int64_t in_channels,
                                const spconv_layer_desc *layers, int num_layers, uint64_t seed,
                                spconv_net **out) {
    static const char func[] = "spconv_net_create";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_RETURN_ERROR_IF(num_layers < 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: a network needs at least one layer (num_layers = %d)", func,
                           num_layers);
    SPCONV_CHECK_NOT_NULL(func, layers);
    SPCONV_RETURN_ERROR_IF(!spconv_dtype_is_floating(dtype), SPCONV_ERR_NOT_SUPPORTED,
                           "%s: networks compute on floating-point features (f16, bf16, f32, f64), "
                           "not %s",
                           func, spconv_dtype_name(dtype));
    SPCONV_RETURN_ERROR_IF(in_channels <= 0, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: in_channels must be > 0 (it is %" PRId64 ")", func, in_channels);
    spconv_net *net = calloc(1, sizeof *net);
    SPCONV_RETURN_ERROR_IF(net == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for a network", func);
    net->dtype = dtype;
    net->in_channels = in_channels;
    net->num_layers = num_layers;
    net->layers = calloc((size_t)num_layers, sizeof *net->layers);
    net->tape = calloc((size_t)num_layers, sizeof *net->tape);
    spconv_status st = SPCONV_OK;
    if (net->layers == NULL || net->tape == NULL)
        SPCONV_FAIL_GOTO(st, fail, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory for %d layers",
                         func, num_layers);
    SPCONV_TRY_GOTO(st, copy_layers(func, net, layers), fail);
    int64_t channels = in_channels;
    for (int i = 0; i < num_layers; ++i)
        SPCONV_TRY_GOTO(st, check_layer(func, net->layers, i, num_layers, &channels), fail);
    SPCONV_TRY_GOTO(st, spconv__net_init_params(net, seed), fail);
    *out = net;
    return SPCONV_OK;
fail:
    spconv_net_destroy(net);
    return st;
}

void spconv_net_destroy(spconv_net *net) {
    if (net == NULL) return;
    spconv__net_clear_tape(net);
    for (int i = 0; i < net->num_params; ++i) {
        free(net->params[i].name);
        spconv_tensor_release(net->params[i].value);
        spconv_tensor_release(net->params[i].grad);
    }
    free(net->params);
    if (net->layers != NULL)
        for (int i = 0; i < net->num_layers; ++i) {
            free(net->layers[i].name_owned);
            free(net->layers[i].key_owned);
        }
    free(net->layers);
    free(net->tape);
    spconv_storage_release(net->dense_storage);
    spconv__net_mirror_release(net->kept);
    spconv__device_clock_destroy(net->clock);
    free(net);
}

void spconv__net_clear_tape(spconv_net *net) {
    spconv__net_mirror_release(net->tape_mirror);
    net->tape_mirror = NULL;
    if (net->tape == NULL) return;
    for (int i = 0; i < net->num_layers; ++i) {
        spconv__layer_tape *t = &net->tape[i];
        spconv_sparse_release(t->in);
        spconv_sparse_release(t->out);
        spconv_rulebook_release(t->rulebook);
        spconv_tensor_release(t->argmax);
        spconv_tensor_release(t->bn_stats);
        memset(t, 0, sizeof *t);
    }
    net->has_tape = 0;
}

/* ---- accessors ------------------------------------------------------------------------------- */

int spconv_net_num_layers(const spconv_net *net) { return net->num_layers; }

const spconv_layer_desc *spconv_net_layer(const spconv_net *net, int index) {
    return index >= 0 && index < net->num_layers ? &net->layers[index].desc : NULL;
}

spconv_dtype spconv_net_dtype(const spconv_net *net) { return net->dtype; }

spconv_dtype spconv__net_param_dtype(const spconv_net *net, spconv_layer_kind kind) {
    const int half = net->dtype == SPCONV_F16 || net->dtype == SPCONV_BF16;
    return half && kind == SPCONV_LAYER_BATCHNORM ? SPCONV_F32 : net->dtype;
}

int64_t spconv_net_in_channels(const spconv_net *net) { return net->in_channels; }

int64_t spconv_net_out_channels(const spconv_net *net) {
    return net->layers[net->num_layers - 1].c_out;
}

int spconv_net_num_params(const spconv_net *net) { return net->num_params; }

static int param_in_range(const spconv_net *net, int index) {
    return index >= 0 && index < net->num_params;
}

const char *spconv_net_param_name(const spconv_net *net, int index) {
    return param_in_range(net, index) ? net->params[index].name : NULL;
}

int spconv_net_find_param(const spconv_net *net, const char *name) {
    if (name == NULL) return -1;
    for (int i = 0; i < net->num_params; ++i)
        if (strcmp(net->params[i].name, name) == 0) return i;
    return -1;
}

spconv_tensor *spconv_net_param(const spconv_net *net, int index) {
    return param_in_range(net, index) ? net->params[index].value : NULL;
}

int spconv_net_param_trainable(const spconv_net *net, int index) {
    return param_in_range(net, index) ? net->params[index].trainable : 0;
}

spconv_tensor *spconv_net_param_grad(const spconv_net *net, int index) {
    return param_in_range(net, index) ? net->params[index].grad : NULL;
}

/* "other" is whatever the named phases leave of the total. */
static void recompute_other(spconv_phase_ms *phase) {
    const double other =
        phase->total - phase->rulebook - phase->gather - phase->gemm - phase->scatter;
    phase->other = other > 0.0 ? other : 0.0;
}

spconv_status spconv__net_clock_start(spconv_net *net, spconv_device device) {
    if (net->timing == SPCONV_NET_TIME_NONE) device = spconv_cpu(); /* no clock: the host's */
    if (net->clock != NULL && !spconv_device_equal(spconv__device_clock_device(net->clock), device)) {
        spconv__device_clock_destroy(net->clock);
        net->clock = NULL;
    }
    if (net->clock == NULL && device.type != SPCONV_DEVICE_CPU)
        SPCONV_FORWARD_IF_ERROR(spconv__device_clock_create(device, &net->clock));
    spconv__device_clock_reset(net->clock);
    return SPCONV_OK;
}

spconv_status spconv__net_clock_mark(spconv_net *net, spconv_context *ctx, int *mark) {
    return spconv__device_clock_mark(net->clock, ctx, mark);
}

spconv_status spconv__net_clock_span_since(spconv_net *net, spconv_context *ctx, int first,
                                           double *dest) {
    int last = -1;
    SPCONV_FORWARD_IF_ERROR(spconv__device_clock_mark(net->clock, ctx, &last));
    return spconv__device_clock_span(net->clock, first, last, dest);
}

spconv_status spconv__net_finish_phase(spconv_net *net, spconv_context *ctx,
                                       spconv_phase_ms *phase, double start_s, int first) {
    if (net->clock != NULL) return spconv__net_clock_span_since(net, ctx, first, &phase->total);
    phase->total = 1e3 * (spconv__now_s() - start_s);
    recompute_other(phase);
    return SPCONV_OK;
}

const spconv_layer_stats *spconv_net_stats(const spconv_net *net, int index) {
    if (index < 0 || index >= net->num_layers) return NULL;
    if (spconv__device_clock_pending(net->clock)) {
        /* The spans of the last pass, read now (waiting for the pass): the statistics are the
         * network's own fields, filled in late, not a change the caller could see otherwise. */
        spconv_net *mutable_net = (spconv_net *)net;
        if (spconv__device_clock_resolve(mutable_net->clock) == SPCONV_OK)
            for (int i = 0; i < net->num_layers; ++i) {
                recompute_other(&mutable_net->layers[i].stats.forward);
                recompute_other(&mutable_net->layers[i].stats.backward);
            }
    }
    return &net->layers[index].stats;
}

void spconv_net_set_timing(spconv_net *net, spconv_net_timing timing) {
    if (net != NULL && (timing == SPCONV_NET_TIME_LAYERS || timing == SPCONV_NET_TIME_PHASES ||
                        timing == SPCONV_NET_TIME_NONE))
        net->timing = timing;
}

void spconv_net_set_progress(spconv_net *net, spconv_net_progress_fn fn, void *user) {
    net->progress = fn;
    net->progress_user = user;
}
