/* Makes the project's own sample LiDAR scan: a 64-beam spinning sensor (HDL-64E-like beam
 * elevations from +2 to -24.8 degrees) in a small procedural street, ray-cast analytically, with
 * range noise, dropouts and an intensity from material and incidence angle. Deterministic from
 * the seed. Written as a KITTI .bin (float32 x, y, z, intensity; x forward, y left, z up, sensor
 * at the origin 1.73 m above the road, as KITTI's Velodyne).
 *   gen_sample_scan [--seed N] [--azimuth-step DEG] [--out PATH]
 * The repository's data/sample_scan.bin is `gen_sample_scan --out data/sample_scan.bin`. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spconv/spconv.h"

#define PI 3.14159265358979323846
#define SENSOR_HEIGHT 1.73 /* KITTI's Velodyne above the road */
#define MIN_RANGE 2.5      /* closer returns hit the sensor's own car and are discarded */
#define MAX_RANGE 100.0
#define RANGE_NOISE 0.02   /* metres, one sigma */
#define DROPOUT 0.02       /* returns lost at random */
#define DETECTION_THRESHOLD 0.06 /* echo strength detected half of the time (see sample) */
#define BEAMS 64
#define MAX_SHAPES 256

/* ---- deterministic random numbers (splitmix64) ------------------------------------------- */

typedef struct rng {
    uint64_t state;
} rng;

static uint64_t rng_next(rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static double rng_uniform(rng *r, double lo, double hi) {
    return lo + (hi - lo) * (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static double rng_gauss(rng *r) { /* Box-Muller */
    double u = rng_uniform(r, 1e-12, 1.0), v = rng_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u)) * cos(2.0 * PI * v);
}

/* ---- the street ------------------------------------------------------------------------- */

typedef enum shape_kind { BOX, CYLINDER, SPHERE } shape_kind;

/* Boxes turn about z by `yaw` around their centre; cylinders stand upright from z0 to z1. */
typedef struct shape {
    shape_kind kind;
    double centre[3];
    double half[3];
    double yaw;
    double radius, z0, z1;
    double reflectivity;
} shape;

typedef struct scene {
    shape shapes[MAX_SHAPES];
    int count;
} scene;

typedef struct hit {
    double t;
    double normal[3];
    double reflectivity;
} hit;

static const double ground_z = -SENSOR_HEIGHT;

static void add_box(scene *s, double cx, double cy, double z0, double lx, double ly, double h,
                    double yaw, double reflectivity) {
    if (s->count == MAX_SHAPES) return;
    s->shapes[s->count++] = (shape){BOX, {cx, cy, z0 + h / 2}, {lx / 2, ly / 2, h / 2}, yaw,
                                    0, 0, 0, reflectivity};
}

static void add_cylinder(scene *s, double cx, double cy, double radius, double z0, double z1,
                         double reflectivity) {
    if (s->count == MAX_SHAPES) return;
    s->shapes[s->count++] = (shape){CYLINDER, {cx, cy, 0}, {0, 0, 0}, 0, radius, z0, z1,
                                    reflectivity};
}

static void add_sphere(scene *s, double cx, double cy, double cz, double radius,
                       double reflectivity) {
    if (s->count == MAX_SHAPES) return;
    s->shapes[s->count++] = (shape){SPHERE, {cx, cy, cz}, {0, 0, 0}, 0, radius, 0, 0, reflectivity};
}

/* Buildings along one side (facade at |y| = facade), with gaps for side streets. */
static void add_buildings(scene *s, rng *r, double side, double facade) {
    for (double x = -70.0; x < 90.0;) {
        double width = rng_uniform(r, 8.0, 22.0);
        if (rng_uniform(r, 0, 1) > 0.15) {
            double setback = rng_uniform(r, 0.0, 2.5), depth = 12.0;
            double y = side * (facade + setback + depth / 2);
            add_box(s, x + width / 2, y, ground_z, width - 0.3, depth, rng_uniform(r, 6.0, 20.0),
                    0.0, rng_uniform(r, 0.25, 0.45));
        }
        x += width;
    }
}

/* A car: body and cabin, parked along a kerb or driving. */
static void add_car(scene *s, rng *r, double x, double y, double yaw) {
    double length = rng_uniform(r, 3.9, 4.9), width = rng_uniform(r, 1.7, 1.95);
    double paint = rng_uniform(r, 0.3, 0.8);
    add_box(s, x, y, ground_z + 0.25, length, width, 0.8, yaw, paint);
    double cabin_shift = rng_uniform(r, -0.4, 0.1);
    add_box(s, x + cabin_shift * cos(yaw), y + cabin_shift * sin(yaw), ground_z + 1.05,
            length * 0.55, width * 0.9, rng_uniform(r, 0.4, 0.6), yaw, 0.15);
}

static void build_street(scene *s, rng *r) {
    s->count = 0;
    add_buildings(s, r, +1.0, 9.5);
    add_buildings(s, r, -1.0, 10.0);
    add_box(s, 95.0, 0.0, ground_z, 4.0, 40.0, 15.0, 0.0, 0.35); /* the end of the street */
    for (int side = -1; side <= 1; side += 2)
        for (double x = rng_uniform(r, -60, -50); x < 80.0; x += rng_uniform(r, 5.5, 14.0))
            if (rng_uniform(r, 0, 1) < 0.7 && fabs(x) > 4.0)
                add_car(s, r, x, side * rng_uniform(r, 5.2, 5.6), rng_uniform(r, -0.05, 0.05));
    add_car(s, r, 14.0, -1.9, 0.02);  /* driving ahead on the right lane */
    add_car(s, r, -22.0, 1.8, PI);    /* oncoming, behind */
    add_car(s, r, 37.0, 2.0, PI - 0.03);
    for (int side = -1; side <= 1; side += 2)
        for (double x = -55.0; x < 85.0; x += 18.0)
            add_cylinder(s, x + side * 4.0, side * 7.4, 0.12, ground_z, ground_z + 7.0, 0.6);
    for (int k = 0; k < 6; ++k) { /* trees: a trunk and a crown */
        double x = rng_uniform(r, -50, 70), y = (k % 2 ? 1 : -1) * 8.0;
        add_cylinder(s, x, y, 0.2, ground_z, ground_z + 3.0, 0.25);
        add_sphere(s, x, y, ground_z + 4.2, rng_uniform(r, 1.5, 2.3), 0.2);
    }
}

/* ---- ray casting (rays start at the sensor, the origin) -------------------------------------- */

static void consider(hit *best, double t, double nx, double ny, double nz, double reflectivity) {
    if (t <= MIN_RANGE * 0.5 || t >= best->t) return;
    *best = (hit){t, {nx, ny, nz}, reflectivity};
}

static void hit_box(const shape *b, const double d[3], hit *best) {
    /* into the box frame: translate, then turn by -yaw */
    double c = cos(b->yaw), s = sin(b->yaw);
    double o[3] = {-b->centre[0], -b->centre[1], -b->centre[2]};
    double lo[3] = {c * o[0] + s * o[1], -s * o[0] + c * o[1], o[2]};
    double ld[3] = {c * d[0] + s * d[1], -s * d[0] + c * d[1], d[2]};
    double t_in = -INFINITY, t_out = INFINITY;
    int axis_in = 0;
    for (int a = 0; a < 3; ++a) {
        if (fabs(ld[a]) < 1e-12) {
            if (fabs(lo[a]) > b->half[a]) return;
            continue;
        }
        double t0 = (-b->half[a] - lo[a]) / ld[a], t1 = (b->half[a] - lo[a]) / ld[a];
        if (t0 > t1) { double tmp = t0; t0 = t1; t1 = tmp; }
        if (t0 > t_in) { t_in = t0; axis_in = a; }
        if (t1 < t_out) t_out = t1;
    }
    if (t_in > t_out || t_in <= 0) return;
    double n[3] = {0, 0, 0};
    n[axis_in] = ld[axis_in] > 0 ? -1.0 : 1.0;
    consider(best, t_in, c * n[0] - s * n[1], s * n[0] + c * n[1], n[2], b->reflectivity);
}

static void hit_cylinder(const shape *cy, const double d[3], hit *best) {
    double ox = -cy->centre[0], oy = -cy->centre[1];
    double a = d[0] * d[0] + d[1] * d[1], b = 2 * (ox * d[0] + oy * d[1]);
    double c = ox * ox + oy * oy - cy->radius * cy->radius, disc = b * b - 4 * a * c;
    if (a < 1e-12 || disc < 0) return;
    double t = (-b - sqrt(disc)) / (2 * a), z = t * d[2];
    if (z < cy->z0 || z > cy->z1) return;
    double nx = (ox + t * d[0]) / cy->radius, ny = (oy + t * d[1]) / cy->radius;
    consider(best, t, nx, ny, 0.0, cy->reflectivity);
}

static void hit_sphere(const shape *sp, const double d[3], hit *best) {
    double o[3] = {-sp->centre[0], -sp->centre[1], -sp->centre[2]};
    double b = o[0] * d[0] + o[1] * d[1] + o[2] * d[2];
    double c = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] - sp->radius * sp->radius;
    double disc = b * b - c;
    if (disc < 0) return;
    double t = -b - sqrt(disc);
    double n[3];
    for (int k = 0; k < 3; ++k) n[k] = (o[k] + t * d[k]) / sp->radius;
    consider(best, t, n[0], n[1], n[2], sp->reflectivity);
}

/* Road with dashed centre line, kerb-side sidewalks. */
static double ground_reflectivity(double x, double y) {
    if (fabs(y) < 0.08 && fmod(x + 1000.0, 6.0) < 3.0) return 0.8;
    return fabs(y) < 7.0 ? 0.12 : 0.3;
}

static int cast(const scene *s, const double d[3], hit *out) {
    hit best = {MAX_RANGE, {0, 0, 0}, 0};
    if (d[2] < 0) {
        double t = ground_z / d[2];
        consider(&best, t, 0, 0, 1, ground_reflectivity(t * d[0], t * d[1]));
    }
    for (int i = 0; i < s->count; ++i) {
        const shape *sh = &s->shapes[i];
        if (sh->kind == BOX) hit_box(sh, d, &best);
        else if (sh->kind == CYLINDER) hit_cylinder(sh, d, &best);
        else hit_sphere(sh, d, &best);
    }
    *out = best;
    return best.t < MAX_RANGE;
}

/* ---- the sensor ------------------------------------------------------------------------- */

/* HDL-64E-like: 32 upper lasers from +2 to -8.33 degrees, 32 lower from -8.83 to -24.8. */
static double beam_elevation(int beam) {
    if (beam < 32) return 2.0 - beam * (10.33 / 31.0);
    return -8.83 - (beam - 32) * (15.97 / 31.0);
}

/* One return: noisy range, intensity from material and incidence; 0 when dropped. Weak echoes
 * (dark, grazing, far) are detected less often, as a real receiver's threshold does. */
static int sample(const scene *s, rng *r, double azimuth, double elevation, float out[4]) {
    double d[3] = {cos(elevation) * cos(azimuth), cos(elevation) * sin(azimuth), sin(elevation)};
    hit h;
    if (!cast(s, d, &h) || rng_uniform(r, 0, 1) < DROPOUT) return 0;
    double range = h.t + RANGE_NOISE * rng_gauss(r);
    if (range < MIN_RANGE) return 0;
    double cos_incidence = fabs(d[0] * h.normal[0] + d[1] * h.normal[1] + d[2] * h.normal[2]);
    double echo = h.reflectivity * (0.25 + 0.75 * cos_incidence);
    double snr = echo * (30.0 / range) * (30.0 / range);
    if (rng_uniform(r, 0, 1) > snr / (snr + DETECTION_THRESHOLD)) return 0;
    double intensity = echo + 0.02 * rng_gauss(r);
    intensity = intensity < 0 ? 0 : intensity > 1 ? 1 : intensity;
    for (int k = 0; k < 3; ++k) out[k] = (float)(range * d[k]);
    out[3] = (float)(round(intensity * 100.0) / 100.0); /* KITTI stores two decimals */
    return 1;
}

/* Returns 0 on any unknown option, missing value or value that is not a whole number. */
static int parse_args(int argc, char **argv, uint64_t *seed, double *step, const char **out) {
    for (int i = 1; i < argc; ++i) {
        char *end = NULL;
        if (i + 1 < argc && strcmp(argv[i], "--seed") == 0) {
            *seed = strtoull(argv[++i], &end, 10);
        } else if (i + 1 < argc && strcmp(argv[i], "--azimuth-step") == 0) {
            *step = strtod(argv[++i], &end);
        } else if (i + 1 < argc && strcmp(argv[i], "--out") == 0) {
            *out = argv[++i];
            continue;
        }
        if (end == NULL || end == argv[i] || *end != '\0') return 0;
    }
    return *step >= 0.01 && *step <= 5.0;
}

int main(int argc, char **argv) {
    uint64_t seed = 4;
    double step_deg = 0.2;
    const char *out = "sample_scan.bin";
    if (!parse_args(argc, argv, &seed, &step_deg, &out)) {
        fprintf(stderr, "usage: gen_sample_scan [--seed N] [--azimuth-step DEG in [0.01, 5]] "
                        "[--out PATH]\n");
        return 2;
    }
    rng r = {seed};
    scene street;
    build_street(&street, &r);
    const int64_t steps = (int64_t)(360.0 / step_deg);
    float *points = malloc((size_t)(steps * BEAMS) * 4 * sizeof *points);
    if (points == NULL) {
        fprintf(stderr, "gen_sample_scan: out of memory\n");
        return 1;
    }
    int64_t count = 0;
    for (int64_t k = 0; k < steps; ++k) /* one revolution, all lasers fire at each azimuth */
        for (int beam = 0; beam < BEAMS; ++beam) {
            double azimuth = PI - 2.0 * PI * (double)k / (double)steps;
            count += sample(&street, &r, azimuth, beam_elevation(beam) * PI / 180.0,
                            points + count * 4);
        }
    spconv_tensor *t = NULL;
    spconv_status st = spconv_tensor_wrap(spconv_cpu(), SPCONV_F32, 2, (const int64_t[]){count, 4},
                                          NULL, points, NULL, NULL, &t);
    if (st == SPCONV_OK) st = spconv_bin_write(NULL, out, t);
    spconv_tensor_release(t);
    free(points);
    if (st != SPCONV_OK) {
        fprintf(stderr, "gen_sample_scan: %s\n", spconv_last_error());
        return 1;
    }
    printf("%s: %lld points (%d beams x %lld azimuth steps of %.3g degrees, %d shapes, seed %llu)\n",
           out, (long long)count, BEAMS, (long long)steps, step_deg, street.count,
           (unsigned long long)seed);
    return 0;
}
