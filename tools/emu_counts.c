/* What a zoo network's passes cost a GPU in launches and host waits, counted by the CUDA host
 * emulation (cuda/emulation: spconv__cuda_emulation_launches / _host_waits), so that a change to
 * the GPU path can be weighed where no GPU exists. Built only with -DSPCONV_CUDA_EMULATION=ON.
 *
 *   emu_counts [--net second|basic|unet] [--input SCAN]
 *
 * Runs, on a fresh input each time (every rulebook built in the pass): an inference forward, a
 * training forward, and the backward of a gradient of ones, with the parameters kept on the
 * device. Prints one `result` line per pass: launches (kernels, cuBLAS products, memsets, copies)
 * and host waits (each copy to the host and each synchronisation counts one). These are counts,
 * not times: what each launch and wait costs is the GPU's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spconv/spconv.h"

unsigned long long spconv__cuda_emulation_launches(void);
unsigned long long spconv__cuda_emulation_host_waits(void);

#ifndef SPCONV_SAMPLE_DATA_DIR
#define SPCONV_SAMPLE_DATA_DIR "data"
#endif

static int failed(const char *what) {
    fprintf(stderr, "emu_counts: %s: %s\n", what, spconv_last_error());
    return 1;
}

typedef struct counts {
    unsigned long long launches, waits;
} counts;

static counts now(void) {
    counts c = {spconv__cuda_emulation_launches(), spconv__cuda_emulation_host_waits()};
    return c;
}

static void report(const char *net, const char *pass, counts before) {
    const counts after = now();
    printf("result net=%s pass=%s launches=%llu host_waits=%llu\n", net, pass,
           after.launches - before.launches, after.waits - before.waits);
}

int main(int argc, char **argv) {
    const char *name = "basic", *input = SPCONV_SAMPLE_DATA_DIR "/sample_scan.bin";
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--net") == 0 && i + 1 < argc) {
            name = argv[++i];
        } else if (strcmp(argv[i], "--input") == 0 && i + 1 < argc) {
            input = argv[++i];
        } else {
            fprintf(stderr, "usage: emu_counts [--net second|basic|unet] [--input SCAN]\n");
            return 2;
        }
    }
    spconv_net_input zin;
    if (spconv_zoo_input(name, &zin) != SPCONV_OK) return failed("--net");
    spconv_point_cloud *pc = NULL;
    if (spconv_point_cloud_read(input, SPCONV_CLOUD_AUTO, 0, &pc) != SPCONV_OK)
        return failed("--input");
    int status = 1;
    spconv_tensor *pts = NULL, *f = NULL, *idx = NULL, *y = NULL, *gy = NULL, *dx = NULL;
    spconv_sparse_tensor *host = NULL, *in = NULL;
    spconv_net *net = NULL;
    spconv_context *ctx = NULL;
    const spconv_device cuda = spconv_cuda(0);
    int64_t shape[3];
    if (spconv_tensor_narrow(spconv_point_cloud_points(pc), 1, 0, zin.point_columns, &pts) !=
            SPCONV_OK ||
        spconv_net_input_from_points(NULL, &zin, pts, SPCONV_F32, &host, NULL) != SPCONV_OK) {
        failed("voxelizing the input");
        goto done;
    }
    spconv_sparse_spatial_shape(host, shape);
    if (spconv_context_create(cuda, &ctx) != SPCONV_OK ||
        spconv_tensor_to_device(ctx, spconv_sparse_features(host), cuda, &f) != SPCONV_OK ||
        spconv_tensor_to_device(ctx, spconv_sparse_indices(host), cuda, &idx) != SPCONV_OK ||
        spconv_zoo_create(name, SPCONV_F32, 1, &net) != SPCONV_OK ||
        spconv_net_keep_on_device(ctx, net, cuda) != SPCONV_OK) {
        failed("the network on the emulated device");
        goto done;
    }
    printf("emu_counts: %s on %s, %lld sites\n", name, input,
           (long long)spconv_sparse_num_sites(host));
    static const char *passes[2] = {"inference", "training"};
    for (int p = 0; p < 2; ++p) {
        spconv_sparse_release(in);
        in = NULL;
        spconv_tensor_release(y);
        y = NULL;
        if (spconv_sparse_create(f, idx, shape, spconv_sparse_batch_size(host), &in) != SPCONV_OK) {
            failed("the input");
            goto done;
        }
        const counts before = now();
        if (spconv_net_forward(ctx, net, in,
                               p == 0 ? SPCONV_NET_INFERENCE : SPCONV_NET_TRAINING, &y,
                               NULL) != SPCONV_OK) {
            failed(passes[p]);
            goto done;
        }
        report(name, passes[p], before);
    }
    if (spconv_tensor_zeros(ctx, cuda, SPCONV_F32, spconv_tensor_ndim(y), spconv_tensor_sizes(y),
                            &gy) != SPCONV_OK ||
        spconv_tensor_fill(ctx, gy, 1.0) != SPCONV_OK) {
        failed("the output gradient");
        goto done;
    }
    const counts before = now();
    if (spconv_net_backward(ctx, net, gy, &dx) != SPCONV_OK) {
        failed("backward");
        goto done;
    }
    report(name, "backward", before);
    status = 0;
done:
    spconv_tensor_release(pts);
    spconv_tensor_release(f);
    spconv_tensor_release(idx);
    spconv_tensor_release(y);
    spconv_tensor_release(gy);
    spconv_tensor_release(dx);
    spconv_sparse_release(host);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
    spconv_context_destroy(ctx);
    spconv_point_cloud_destroy(pc);
    return status;
}
