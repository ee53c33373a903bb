/* The network's parameters on a device other than the CPU. The parameters themselves stay CPU
 * tensors (net.h); a pass on a CUDA device reads a copy of them there, made in one transfer: every
 * parameter and every batch norm's inference terms (and its gamma and beta as doubles, which a
 * training pass reads) packed into one device block, so that no layer uploads anything. spconv_net_keep_on_device keeps that copy across passes; the library's own
 * changes to parameters bump net->param_version, and a pass that finds the kept copy of an older
 * version makes it again. Without a kept copy each pass makes its own and drops it at the end. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "net/net_internal.h"
#include "tensor/tensor_impl.h"

void spconv__net_bn_inference_terms(const spconv_net *net, const spconv__net_layer *bn,
                                    double *work) {
    const int64_t c = bn->c_in;
    const spconv__net_param *params = &net->params[bn->first_param];
    for (int k = 0; k < 4; ++k) spconv__net_to_doubles(params[k].value, work + k * c);
    double *scale = work + 4 * c, *shift = work + 5 * c;
    for (int64_t ch = 0; ch < c; ++ch) {
        scale[ch] = work[ch] / sqrt(work[3 * c + ch] + bn->desc.eps);
        shift[ch] = work[c + ch] - work[2 * c + ch] * scale[ch];
    }
}

void spconv__net_mirror_release(spconv__net_mirror *mirror) {
    if (mirror == NULL || --mirror->refcount > 0) return;
    if (mirror->params != NULL)
        for (int i = 0; i < mirror->num_params; ++i) spconv_tensor_release(mirror->params[i]);
    if (mirror->bn_terms != NULL)
        for (int i = 0; i < mirror->num_layers; ++i) spconv_tensor_release(mirror->bn_terms[i]);
    free(mirror->params);
    free(mirror->bn_terms);
    free(mirror);
}

/* Bytes of the packed block: the parameters in order, then the batch norms' terms. */
static size_t packed_bytes(const spconv_net *net) {
    size_t total = 0;
    for (int i = 0; i < net->num_params; ++i)
        total += spconv__net_piece_bytes((size_t)spconv_tensor_numel(net->params[i].value) *
                             spconv__tensor_element_size(net->params[i].value));
    for (int i = 0; i < net->num_layers; ++i)
        if (net->layers[i].desc.kind == SPCONV_LAYER_BATCHNORM)
            total += spconv__net_piece_bytes((size_t)(4 * net->layers[i].c_in) * sizeof(double));
    return total;
}

/* The host image of the block, and the views over @p storage that match it. */
static spconv_status pack(const spconv_net *net, spconv_storage *storage, unsigned char *host,
                          spconv__net_mirror *m) {
    size_t at = 0;
    for (int i = 0; i < net->num_params; ++i) {
        const spconv_tensor *t = net->params[i].value;
        const size_t elem = spconv__tensor_element_size(t);
        const size_t bytes = (size_t)spconv_tensor_numel(t) * elem;
        if (bytes > 0) memcpy(host + at, spconv_tensor_data(t), bytes);
        SPCONV_FORWARD_IF_ERROR(spconv__tensor_make(storage, (int64_t)(at / elem), t->dtype,
                                                    t->ndim, t->sizes, t->strides,
                                                    &m->params[i]));
        at += spconv__net_piece_bytes(bytes);
    }
    for (int i = 0; i < net->num_layers; ++i) {
        const spconv__net_layer *layer = &net->layers[i];
        if (layer->desc.kind != SPCONV_LAYER_BATCHNORM) continue;
        const int64_t c = layer->c_in;
        double *work = malloc((size_t)(6 * (c > 0 ? c : 1)) * sizeof *work);
        SPCONV_RETURN_ERROR_IF(work == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                               "out of host memory for the terms of %" PRId64 " channels", c);
        spconv__net_bn_inference_terms(net, layer, work); /* gamma, beta, ..., scale, shift */
        memcpy(host + at, work + 4 * c, (size_t)(2 * c) * sizeof(double));
        memcpy(host + at + (size_t)(2 * c) * sizeof(double), work,
               (size_t)(2 * c) * sizeof(double));
        free(work);
        const int64_t sizes[2] = {4, c}, strides[2] = {c, 1};
        SPCONV_FORWARD_IF_ERROR(spconv__tensor_make(storage, (int64_t)(at / sizeof(double)),
                                                    SPCONV_F64, 2, sizes, strides,
                                                    &m->bn_terms[i]));
        at += spconv__net_piece_bytes((size_t)(4 * c) * sizeof(double));
    }
    return SPCONV_OK;
}

/* A new copy on @p device, one reference. */
static spconv_status make_mirror(const char *func, spconv_context *ctx, const spconv_net *net,
                                 spconv_device device, spconv__net_mirror **out) {
    *out = NULL;
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    spconv__net_mirror *m = calloc(1, sizeof *m);
    SPCONV_RETURN_ERROR_IF(m == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory", func);
    m->refcount = 1;
    m->device = device;
    m->version = net->param_version;
    m->num_params = net->num_params;
    m->num_layers = net->num_layers;
    m->params = calloc((size_t)(net->num_params > 0 ? net->num_params : 1), sizeof *m->params);
    m->bn_terms = calloc((size_t)(net->num_layers > 0 ? net->num_layers : 1), sizeof *m->bn_terms);
    const size_t total = packed_bytes(net);
    unsigned char *host = malloc(total > 0 ? total : 1);
    spconv_storage *storage = NULL;
    spconv_status st = SPCONV_OK;
    if (m->params == NULL || m->bn_terms == NULL || host == NULL)
        SPCONV_FAIL_GOTO(st, fail, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for %zu bytes of parameters", func, total);
    SPCONV_TRY_GOTO(st, spconv__storage_create_in(func, ctx, device, total, &storage), fail);
    SPCONV_TRY_GOTO(st, pack(net, storage, host, m), fail);
    /* One transfer; the copy to a device returns once the host buffer may be reused. */
    if (total > 0)
        SPCONV_TRY_GOTO(st,
                        backend->copy_to_device(ctx, device.index, spconv_storage_data(storage),
                                                host, total),
                        fail);
    spconv_storage_release(storage); /* the views hold it */
    free(host);
    *out = m;
    return SPCONV_OK;
fail:
    spconv_storage_release(storage);
    free(host);
    spconv__net_mirror_release(m);
    return st;
}

spconv_status spconv__net_mirror_for(spconv_context *ctx, spconv_net *net, spconv_device device,
                                     spconv__net_mirror **out) {
    static const char func[] = "spconv_net_forward";
    *out = NULL;
    if (device.type == SPCONV_DEVICE_CPU) return SPCONV_OK;
    spconv__net_mirror *kept = net->kept;
    if (kept != NULL && spconv_device_equal(kept->device, device)) {
        if (kept->version != net->param_version) {
            spconv__net_mirror *fresh = NULL;
            SPCONV_FORWARD_IF_ERROR(make_mirror(func, ctx, net, device, &fresh));
            spconv__net_mirror_release(kept);
            net->kept = kept = fresh;
        }
        kept->refcount++;
        *out = kept;
        return SPCONV_OK;
    }
    return make_mirror(func, ctx, net, device, out);
}

spconv_status spconv_net_keep_on_device(spconv_context *ctx, spconv_net *net,
                                        spconv_device device) {
    static const char func[] = "spconv_net_keep_on_device";
    SPCONV_CHECK_NOT_NULL(func, net);
    spconv__net_mirror *fresh = NULL;
    if (device.type != SPCONV_DEVICE_CPU)
        SPCONV_FORWARD_IF_ERROR(make_mirror(func, ctx, net, device, &fresh));
    spconv__net_mirror_release(net->kept);
    net->kept = fresh;
    return SPCONV_OK;
}
