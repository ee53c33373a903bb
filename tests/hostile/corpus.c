/* The hostile-input corpus (see corpus.h). */
#define _XOPEN_SOURCE 700

#include "hostile/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash_flood.h"
#include "spconv/spconv.h"

/* ---- writing helpers ----------------------------------------------------------------------- */

static int fail(const char *what, const char *path) {
    fprintf(stderr, "hostile corpus: %s '%s': %s\n", what, path, strerror(errno));
    return -1;
}

static void join(const char *dir, const char *name, char *buf) {
    snprintf(buf, HOSTILE_PATH_CAP, "%s/%s", dir, name);
}

static int write_text(const char *dir, const char *name, const char *text) {
    char path[HOSTILE_PATH_CAP];
    join(dir, name, path);
    FILE *f = fopen(path, "wb");
    if (f == NULL) return fail("cannot create", path);
    int ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    return ok ? 0 : fail("cannot write", path);
}

static int write_floats(const char *dir, const char *name, const float *v, size_t n) {
    char path[HOSTILE_PATH_CAP];
    join(dir, name, path);
    FILE *f = fopen(path, "wb");
    if (f == NULL) return fail("cannot create", path);
    int ok = fwrite(v, sizeof *v, n, f) == n;
    ok &= fclose(f) == 0;
    return ok ? 0 : fail("cannot write", path);
}

static int make_fifo(const char *dir, const char *name) {
    char path[HOSTILE_PATH_CAP];
    join(dir, name, path);
    return mkfifo(path, 0600) == 0 ? 0 : fail("cannot make the named pipe", path);
}

static int make_dir(const char *dir, const char *name) {
    char path[HOSTILE_PATH_CAP];
    join(dir, name, path);
    return mkdir(path, 0700) == 0 ? 0 : fail("cannot make the folder", path);
}

static int write_npy(const char *dir, const char *name, spconv_dtype dtype, int ndim,
                     const int64_t *sizes, const void *data) {
    char path[HOSTILE_PATH_CAP];
    join(dir, name, path);
    spconv_tensor *t = NULL;
    spconv_status st = spconv_tensor_from_host(NULL, spconv_cpu(), dtype, ndim, sizes, data, &t);
    if (st == SPCONV_OK) st = spconv_npy_write(NULL, path, t);
    spconv_tensor_release(t);
    if (st == SPCONV_OK) return 0;
    fprintf(stderr, "hostile corpus: cannot write '%s': %s\n", path, spconv_last_error());
    return -1;
}

/* ---- the inputs ------------------------------------------------------------------------------ */

/* A small KITTI-like scan: points spread over SECOND's range (x, y, z, intensity). */
static int write_scan(const char *dir) {
    enum { P = 2000 };
    static float points[P * 4];
    uint64_t state = 12345;
    for (int i = 0; i < P * 4; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        float u = (float)(state >> 40) / (float)(1 << 24);
        const float lo[4] = {0.0f, -40.0f, -3.0f, 0.0f}, hi[4] = {70.0f, 40.0f, 1.0f, 1.0f};
        points[i] = lo[i % 4] + u * (hi[i % 4] - lo[i % 4]);
    }
    return write_floats(dir, "scan.bin", points, P * 4);
}

/* Five sites, their features and a 3x3x3 weight: the inputs of `conv` and `rulebook`. */
static int write_sites(const char *dir) {
    const int32_t sites[5][4] = {{0, 0, 0, 0}, {0, 1, 2, 3}, {0, 2, 2, 2}, {0, 3, 1, 0}, {0, 4, 4, 4}};
    const float features[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
    static float weight[27 * 2 * 3];
    for (int i = 0; i < 27 * 2 * 3; ++i) weight[i] = (float)(i % 7) - 3.0f;
    int rc = write_npy(dir, "sites.npy", SPCONV_I32, 2, (const int64_t[]){5, 4}, sites);
    if (rc == 0) rc = write_npy(dir, "features.npy", SPCONV_F32, 2, (const int64_t[]){5, 2}, features);
    if (rc == 0) rc = write_npy(dir, "weight.npy", SPCONV_F32, 3, (const int64_t[]){27, 2, 3}, weight);
    return rc;
}

/* The unet zoo network's weights, with one parameter file replaced by a named pipe. */
static int write_weights_with_fifo(const char *dir) {
    char path[HOSTILE_PATH_CAP], victim[HOSTILE_PATH_CAP + 260];
    join(dir, "weights_fifo", path);
    spconv_net *net = NULL;
    spconv_status st = spconv_zoo_create("unet", SPCONV_F32, 1, &net);
    if (st == SPCONV_OK) st = spconv_net_save_weights(NULL, net, path, SPCONV_NET_LAYOUT_AUTO);
    spconv_net_destroy(net);
    if (st != SPCONV_OK) {
        fprintf(stderr, "hostile corpus: cannot write '%s': %s\n", path, spconv_last_error());
        return -1;
    }
    /* Every parameter file becomes a pipe, so that whichever the loader opens first is one. */
    DIR *folder = opendir(path);
    if (folder == NULL) return fail("cannot list", path);
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(folder)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        snprintf(victim, sizeof victim, "%s/%s", path, e->d_name);
        if (unlink(victim) != 0) rc = fail("cannot remove", victim);
        else if (mkfifo(victim, 0600) != 0) rc = fail("cannot make the named pipe", victim);
    }
    closedir(folder);
    return rc;
}

/* An output folder that already holds a file the command would replace (coords.npy, a copy of
 * the victim) and, under a later output's name, a folder that no rename can replace. */
static int write_existing_outputs(const char *dir) {
    int rc = make_dir(dir, "existing_out");
    if (rc == 0) rc = write_text(dir, "existing_out/coords.npy", "the user's previous output\n");
    if (rc == 0) rc = make_dir(dir, "existing_out/centres.pcd");
    if (rc == 0) rc = write_text(dir, "existing_out/centres.pcd/keep", "x\n");
    return rc;
}

/* Valid or nearly valid point-cloud files that PCL used to abort on or misread into zeros. */
static int write_point_cloud_files(const char *dir) {
    static const char ply_head[] = "ply\nformat ascii 1.0\nelement vertex 2\n"
                                   "property float x\nproperty float y\nproperty float z\n";
    static const char pcd_head[] = "# .PCD v0.7\nVERSION 0.7\nFIELDS x y z i\nSIZE 4 4 4 1\n"
                                   "TYPE F F F I\nCOUNT 1 1 1 1\nWIDTH 2\nHEIGHT 1\n"
                                   "VIEWPOINT 0 0 0 1 0 0 0\nPOINTS 2\nDATA ascii\n";
    char text[1024];
    snprintf(text, sizeof text, "%sproperty list uint float foo\nend_header\n1 2 3 1 0.5\n4 5 6 0\n",
             ply_head);
    int rc = write_text(dir, "vertex_list.ply", text);
    snprintf(text, sizeof text, "%s1 2 3 4\n1 2 3 300\n", pcd_head);
    if (rc == 0) rc = write_text(dir, "int8_300.pcd", text);
    snprintf(text, sizeof text, "%s1 2 3 4\n1 zz 3 4\n", pcd_head);
    if (rc == 0) rc = write_text(dir, "garbage_token.pcd", text);
    snprintf(text, sizeof text, "%s1.25 2.25 3.25\n1 2 3 4\n", pcd_head);
    if (rc == 0) rc = write_text(dir, "short_line.pcd", text);
    snprintf(text, sizeof text, "%s1 2 3 4 5\n1 2 3 4\n", pcd_head);
    if (rc == 0) rc = write_text(dir, "long_line.pcd", text);
    return rc;
}

/* Inputs crafted against the fixed hash functions the tables had before they were seeded
 * (tests/common/hash_flood.h): a scan whose 262,144 points all start probing in one window of the
 * voxelizer's old table (about 30 s to voxelize on the old code, milliseconds now), and 131,072
 * sites that do the same to the rulebook's old table (about 30 s for a subm 3x3x3 build). */
static int write_flood_inputs(const char *dir) {
    enum { POINTS = 262144, SITES = 131072 };
    const spconv_voxelize_params vp = {{0.05f, 0.05f, 0.1f}, {0, -40, -3, 70.4f, 40, 1}, 5,
                                       INT64_MAX, SPCONV_VOXELIZE_MEAN};
    float *points = malloc((size_t)POINTS * 4 * sizeof *points);
    int32_t *sites = malloc((size_t)SITES * 4 * sizeof *sites);
    float *features = calloc(SITES, sizeof *features);
    const float weight[27] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                              21, 22, 23, 24, 25, 26, 27};
    const int64_t shape[3] = {41, 1600, 1408};
    int rc = points != NULL && sites != NULL && features != NULL ? 0 : -1;
    if (rc == 0 && spconv_flood_voxel_points(POINTS, 4, &vp, points) != POINTS) rc = -1;
    if (rc == 0 && spconv_flood_rulebook_sites(SITES, shape, sites) != SITES) rc = -1;
    if (rc != 0) fprintf(stderr, "hostile corpus: cannot make the crafted inputs\n");
    if (rc == 0) rc = write_floats(dir, "flood.bin", points, (size_t)POINTS * 4);
    if (rc == 0) rc = write_npy(dir, "flood_sites.npy", SPCONV_I32, 2, (const int64_t[]){SITES, 4}, sites);
    if (rc == 0)
        rc = write_npy(dir, "flood_features.npy", SPCONV_F32, 2, (const int64_t[]){SITES, 1}, features);
    if (rc == 0) rc = write_npy(dir, "weight_1x1.npy", SPCONV_F32, 3, (const int64_t[]){27, 1, 1}, weight);
    free(points);
    free(sites);
    free(features);
    return rc;
}

/* 100,000 sites on a lattice 128 apart in z and y, 250 deep in x, for a 255 x 255 x 1 submanifold
 * kernel (the CLI's widest): each site pairs only with itself, but probing the 32,512 offsets
 * below the centre is 3.3 x 10^9 lookups (20.6 s at 2 threads); through bins, 0.24 s. */
static int write_lattice_sites(const char *dir) {
    enum { SITES = 100000 };
    int32_t *sites = malloc((size_t)SITES * 4 * sizeof *sites);
    if (sites == NULL) {
        fprintf(stderr, "hostile corpus: out of memory for the lattice\n");
        return -1;
    }
    for (int32_t r = 0; r < SITES; ++r) {
        sites[4 * r] = 0;
        sites[4 * r + 1] = 128 * (r / 5000);
        sites[4 * r + 2] = 128 * (r / 250 % 20);
        sites[4 * r + 3] = r % 250;
    }
    const int rc =
        write_npy(dir, "lattice_sites.npy", SPCONV_I32, 2, (const int64_t[]){SITES, 4}, sites);
    free(sites);
    return rc;
}

int hostile_corpus_write(const char *dir) {
    char path[HOSTILE_PATH_CAP];
    int rc = write_text(dir, HOSTILE_VICTIM, "a file that no command may touch\n");
    if (rc == 0) rc = write_scan(dir);
    if (rc == 0) rc = write_sites(dir);
    if (rc == 0) rc = make_fifo(dir, "fifo.bin");
    if (rc == 0) rc = make_fifo(dir, "fifo.pcd");
    if (rc == 0) rc = make_fifo(dir, "fifo.npy");
    if (rc == 0) rc = make_dir(dir, "folder.bin");
    if (rc == 0) rc = make_dir(dir, "folder.npy");
    join(dir, "zero.bin", path);
    if (rc == 0 && symlink("/dev/zero", path) != 0) rc = fail("cannot make the symlink", path);
    if (rc == 0) rc = write_weights_with_fifo(dir);
    if (rc == 0) rc = write_existing_outputs(dir);
    if (rc == 0) rc = write_point_cloud_files(dir);
    if (rc == 0) rc = write_flood_inputs(dir);
    if (rc == 0) rc = write_lattice_sites(dir);
    return rc;
}

/* ---- the cases ------------------------------------------------------------------------------- */

#define SCAN_GRID "--voxel-size", "0.05,0.05,0.1", "--range", "0,-40,-3,70.4,40,1"

static const hostile_case cases[] = {
    /* 2. reading blocks forever: never open an input before knowing it is a regular file */
    {"fifo-as-scan", "a named pipe as the scan", HOSTILE_REFUSED, "not a regular file",
     {"info", "@/fifo.bin"}, 10, 0, NULL, 0},
    {"fifo-as-pcd", "a named pipe as a PCD scan", HOSTILE_REFUSED, "not a regular file",
     {"voxelize", "@/fifo.pcd", SCAN_GRID, "--out", "@out"}, 10, 0, NULL, 0},
    {"fifo-as-npy", "a named pipe as an .npy input", HOSTILE_REFUSED, "not a regular file",
     {"rulebook", "--indices", "@/fifo.npy", "--spatial-shape", "8,8,8", "--out", "@out"}, 10, 0,
     NULL, 0},
    {"fifo-in-weights", "a named pipe inside a --weights folder", HOSTILE_REFUSED,
     "not a regular file",
     {"run", "@/scan.bin", "--net", "unet", "--weights", "@/weights_fifo", "--quiet", "--out",
      "@out"}, 20, 0, NULL, 0},
    {"char-device-as-scan", "/dev/zero (through a symlink) as the scan", HOSTILE_REFUSED,
     "not a regular file", {"voxelize", "@/zero.bin", SCAN_GRID, "--out", "@out"}, 10, 0, NULL, 0},
    {"folder-as-scan", "a folder as the scan", HOSTILE_REFUSED, "not a regular file",
     {"info", "@/folder.bin"}, 10, 0, NULL, 0},
    {"folder-as-npy", "a folder as an .npy input", HOSTILE_REFUSED, "not a regular file",
     {"conv", "--indices", "@/sites.npy", "--spatial-shape", "8,8,8", "--features",
      "@/folder.npy", "--weight", "@/weight.npy", "--out", "@out"}, 10, 0, NULL, 0},
    /* 1. a valid PLY with a list property in its vertex element used to abort inside PCL */
    {"ply-vertex-list", "a list property in the vertex element", HOSTILE_REFUSED,
     "property list 'foo' in element 'vertex'",
     {"run", "@/vertex_list.ply", "--net", "unet", "--quiet", "--out", "@out"}, 10, 0, NULL, 0},
    /* 9. ASCII PCD values that used to become zeros or wrap */
    {"pcd-int8-300", "an int8 field of value 300", HOSTILE_REFUSED,
     "line 13: field 'i' value '300' does not fit I1 (int8)",
     {"voxelize", "@/int8_300.pcd", SCAN_GRID, "--out", "@out"}, 10, 0, NULL, 0},
    {"pcd-garbage-token", "a token that is not a number", HOSTILE_REFUSED,
     "line 13: field 'y' value 'zz' is not a number",
     {"info", "@/garbage_token.pcd"}, 10, 0, NULL, 0},
    {"pcd-short-line", "a data line with too few values", HOSTILE_REFUSED,
     "line 12 has 3 values but a point has 4", {"info", "@/short_line.pcd"}, 10, 0, NULL, 0},
    {"pcd-long-line", "a data line with too many values", HOSTILE_REFUSED,
     "line 12 has 5 values but a point has 4", {"info", "@/long_line.pcd"}, 10, 0, NULL, 0},
    /* 4. hash flooding: crafted coordinates in linear time */
    {"flood-voxelize", "262,144 points crafted against the voxelizer's old hash", HOSTILE_SUCCEEDS,
     NULL, {"voxelize", "@/flood.bin", SCAN_GRID}, 10, 0, NULL, 0},
    {"flood-subm-rulebook", "131,072 sites crafted against the rulebook's old hash",
     HOSTILE_SUCCEEDS, NULL,
     {"conv", "--subm", "--indices", "@/flood_sites.npy", "--spatial-shape", "41,1600,1408",
      "--features", "@/flood_features.npy", "--weight", "@/weight_1x1.npy", "--out", "@out"},
     10, 0, NULL, 0},
    /* 5. memory follows the pairs, not kernel volume x threads (old: 1.2 GB at 2 threads, 4.3 GB
     * at 8 for the regular build). The build itself now adds about 1 MB (rulebooks list only
     * their active offsets, test_rulebook caps it); what remains is this command's counts.npy,
     * one int64 per kernel offset by its format (133 MB for 255^3). */
    {"kernel-255-regular", "a 255^3 kernel on 5 sites, 8 threads", HOSTILE_SUCCEEDS, NULL,
     {"rulebook", "--indices", "@/sites.npy", "--spatial-shape", "256,256,256", "--kernel", "255",
      "--threads", "8", "--out", "@out"}, 20, 1536, NULL, 0},
    {"kernel-255-subm", "a 255^3 submanifold kernel on 5 sites, 8 threads", HOSTILE_SUCCEEDS, NULL,
     {"rulebook", "--indices", "@/sites.npy", "--spatial-shape", "256,256,256", "--kernel", "255",
      "--subm", "--threads", "8", "--out", "@out"}, 20, 1536, NULL, 0},
    /* 5b. work follows the pairs, not sites x min(sites, kernel): a submanifold build through bins
     * (rulebook/site_bins.h) tests a few candidates a site (0.24 s in all) where probing every
     * offset took 20.6 s */
    {"subm-kernel-255-lattice", "100,000 sites 128 apart, 255x255x1 subm kernel", HOSTILE_SUCCEEDS,
     NULL,
     {"rulebook", "--indices", "@/lattice_sites.npy", "--spatial-shape", "2560,2560,250",
      "--kernel", "255,255,1", "--subm", "--out", "@out"}, 10, 0, NULL, 0},
    /* 6. allocate only what is produced: the [M, max_points, F] array is not made without --out */
    {"voxelize-huge-max-points", "--max-points 1048576 without --out", HOSTILE_SUCCEEDS, NULL,
     {"voxelize", "@/scan.bin", SCAN_GRID, "--max-points", "1048576"}, 20, 1024, NULL, 0},
    /* 7. a planted symlink at the temporary's name must not redirect the write */
    {"bench-json-symlink", "a symlink planted at bench --json's temporary", HOSTILE_SUCCEEDS, NULL,
     {"bench", "--input", "@/scan.bin", "--net", "unet", "--repeat", "1", "--warmup", "0", "--peak-size", "0",
      "--json", "@/bench.json"}, 60, 0, "@/bench.json", 0},
    /* 8. a failed command leaves every pre-existing file as it was */
    {"failed-commit-keeps-old-files", "an output name taken by a folder, beside an old output",
     HOSTILE_REFUSED, "is a folder",
     {"voxelize", "@/scan.bin", SCAN_GRID, "--out", "@/existing_out"}, 20, 0, NULL, 0},
    /* 10. thread counts that crash the OpenMP runtime */
    {"threads-100000", "--threads 100000", HOSTILE_REFUSED, "outside [1, 1024]",
     {"voxelize", "@/scan.bin", SCAN_GRID, "--threads", "100000"}, 10, 0, NULL, 0},
    /* ... and counts within it whose stacks do not fit the address-space limit: libgomp ended
     * the process with its own two lines and exit status 1 */
    {"threads-600-under-3-gib", "--threads 600 under a 3 GiB address-space limit",
     HOSTILE_REFUSED, "the address-space limit (ulimit -v) leaves",
     {"rulebook", "--indices", "@/sites.npy", "--spatial-shape", "8,8,8", "--threads", "600",
      "--out", "@out"}, 10, 3072, NULL, 1},
    /* 11. messages that name the problem, checked before any work */
    {"voxel-size-nan", "a NaN voxel size", HOSTILE_REFUSED, "the first number, nan, is not finite",
     {"voxelize", "@/scan.bin", "--voxel-size", "nan,1,1", "--range", "0,0,0,1,1,1"}, 10, 0, NULL, 0},
    {"voxel-size-narrowed", "a voxel size that float32 turns into 0", HOSTILE_REFUSED,
     "too small for float32",
     {"voxelize", "@/scan.bin", "--voxel-size", "1e-300,1,1", "--range", "0,0,0,1,1,1"}, 10, 0,
     NULL, 0},
    {"seed-out-of-range", "a seed past 2^63", HOSTILE_REFUSED, "is out of range",
     {"run", "@/scan.bin", "--seed", "18446744073709551615", "--out", "@out"}, 10, 0, NULL, 0},
    {"shape-out-of-range", "a spatial shape of 20 digits", HOSTILE_REFUSED, "is out of range",
     {"rulebook", "--indices", "@/sites.npy", "--spatial-shape", "99999999999999999999,8,8",
      "--out", "@out"}, 10, 0, NULL, 0},
    {"version-bogus", "an unknown option of version", HOSTILE_REFUSED, "unknown option '--bogus'",
     {"version", "--bogus"}, 10, 0, NULL, 0},
    {"bench-json-folder", "bench --json naming a folder", HOSTILE_REFUSED, "is a folder",
     {"bench", "--input", "@/scan.bin", "--net", "basic", "--repeat", "50", "--json", "@/folder.bin"}, 10, 0,
     NULL, 0},
};

const hostile_case *hostile_cases(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
