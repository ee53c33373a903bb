/* Tests of the core: status names, the per-thread last error, contexts, workspace, version and
 * build queries. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/test_util.h"

static void test_status_strings(void **state) {
    (void)state;
    static const struct {
        spconv_status status;
        const char *name;
    } names[] = {
        {SPCONV_OK, "SPCONV_OK"},
        {SPCONV_ERR_INVALID_ARGUMENT, "SPCONV_ERR_INVALID_ARGUMENT"},
        {SPCONV_ERR_NULL_POINTER, "SPCONV_ERR_NULL_POINTER"},
        {SPCONV_ERR_SHAPE_MISMATCH, "SPCONV_ERR_SHAPE_MISMATCH"},
        {SPCONV_ERR_DTYPE_MISMATCH, "SPCONV_ERR_DTYPE_MISMATCH"},
        {SPCONV_ERR_DEVICE_MISMATCH, "SPCONV_ERR_DEVICE_MISMATCH"},
        {SPCONV_ERR_OUT_OF_RANGE, "SPCONV_ERR_OUT_OF_RANGE"},
        {SPCONV_ERR_OVERFLOW, "SPCONV_ERR_OVERFLOW"},
        {SPCONV_ERR_DUPLICATE_INDEX, "SPCONV_ERR_DUPLICATE_INDEX"},
        {SPCONV_ERR_GEOMETRY_MISMATCH, "SPCONV_ERR_GEOMETRY_MISMATCH"},
        {SPCONV_ERR_NOT_FOUND, "SPCONV_ERR_NOT_FOUND"},
        {SPCONV_ERR_OUT_OF_MEMORY, "SPCONV_ERR_OUT_OF_MEMORY"},
        {SPCONV_ERR_CAPACITY, "SPCONV_ERR_CAPACITY"},
        {SPCONV_ERR_IO, "SPCONV_ERR_IO"},
        {SPCONV_ERR_FORMAT, "SPCONV_ERR_FORMAT"},
        {SPCONV_ERR_NOT_SUPPORTED, "SPCONV_ERR_NOT_SUPPORTED"},
        {SPCONV_ERR_NO_DEVICE, "SPCONV_ERR_NO_DEVICE"},
        {SPCONV_ERR_CUDA, "SPCONV_ERR_CUDA"},
        {SPCONV_ERR_CUBLAS, "SPCONV_ERR_CUBLAS"},
        {SPCONV_ERR_INTERNAL, "SPCONV_ERR_INTERNAL"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
        assert_string_equal(spconv_status_string(names[i].status), names[i].name);
    /* the numbers are part of the contract */
    assert_int_equal(SPCONV_ERR_INVALID_ARGUMENT, 100);
    assert_int_equal(SPCONV_ERR_OUT_OF_MEMORY, 200);
    assert_int_equal(SPCONV_ERR_IO, 300);
    assert_int_equal(SPCONV_ERR_NO_DEVICE, 401);
    assert_int_equal(SPCONV_ERR_INTERNAL, 500);
    assert_string_equal(spconv_status_string((spconv_status)12345), "unknown status");
    assert_string_equal(spconv_status_string((spconv_status)-1), "unknown status");
}

static void test_last_error(void **state) {
    (void)state;
    spconv_clear_error();
    assert_string_equal(spconv_last_error(), "");
    SPCONV_ASSERT_FAILS(spconv_context_set_num_threads(NULL, 2), SPCONV_ERR_NULL_POINTER,
                        "spconv_context_set_num_threads: 'ctx' is NULL");
    /* a success does not clear the message; clear_error does */
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_ERROR_CONTAINS("'ctx' is NULL");
    spconv_context_destroy(ctx);
    spconv_clear_error();
    assert_string_equal(spconv_last_error(), "");
}

typedef struct thread_report {
    char seen_at_start[256];
    char own_message[256];
} thread_report;

static void *other_thread(void *arg) {
    thread_report *report = arg;
    snprintf(report->seen_at_start, sizeof report->seen_at_start, "%s", spconv_last_error());
    spconv_context_set_num_threads(NULL, -5);
    snprintf(report->own_message, sizeof report->own_message, "%s", spconv_last_error());
    return NULL;
}

static void test_last_error_is_per_thread(void **state) {
    (void)state;
    SPCONV_ASSERT_FAILS(spconv_context_workspace(NULL, 1, NULL), SPCONV_ERR_NULL_POINTER,
                        "spconv_context_workspace: 'ctx' is NULL");
    thread_report report;
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, other_thread, &report), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_string_equal(report.seen_at_start, "");
    assert_non_null(strstr(report.own_message, "spconv_context_set_num_threads: 'ctx' is NULL"));
    SPCONV_ASSERT_ERROR_CONTAINS("spconv_context_workspace: 'ctx' is NULL");
}

static void test_context_cpu(void **state) {
    (void)state;
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    assert_non_null(ctx);
    assert_true(spconv_device_equal(spconv_context_device(ctx), spconv_cpu()));
    assert_true(spconv_device_equal(spconv_context_device(NULL), spconv_cpu()));
    assert_null(spconv_context_cuda_stream(ctx));
    assert_null(spconv_context_cublas_handle(ctx));
    assert_null(spconv_context_cuda_stream(NULL));
    assert_null(spconv_context_cublas_handle(NULL));
    SPCONV_ASSERT_OK(spconv_context_synchronize(ctx));
    SPCONV_ASSERT_OK(spconv_context_synchronize(NULL));

    assert_true(spconv_context_num_threads(ctx) >= 1);
    assert_true(spconv_context_num_threads(NULL) >= 1);
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, 3));
    assert_int_equal(spconv_context_num_threads(ctx), 3);
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, 0)); /* back to all cores */
    assert_true(spconv_context_num_threads(ctx) >= 1);
    SPCONV_ASSERT_FAILS(spconv_context_set_num_threads(ctx, -1), SPCONV_ERR_INVALID_ARGUMENT,
                        "spconv_context_set_num_threads: num_threads = -1 is outside [0, 1024]");
    /* Counts that crash or exit(1) inside libgomp are refused, and the context keeps its count. */
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, SPCONV_MAX_THREADS));
    assert_int_equal(spconv_context_num_threads(ctx), SPCONV_MAX_THREADS);
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, 2));
    const int refused[] = {SPCONV_MAX_THREADS + 1, 60000, 100000, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i) {
        SPCONV_ASSERT_FAILS(spconv_context_set_num_threads(ctx, refused[i]),
                            SPCONV_ERR_INVALID_ARGUMENT, "is outside [0, 1024]");
        assert_int_equal(spconv_context_num_threads(ctx), 2);
    }
    spconv_context_destroy(ctx);
    spconv_context_destroy(NULL);

    SPCONV_ASSERT_FAILS(spconv_context_create(spconv_cpu(), NULL), SPCONV_ERR_NULL_POINTER,
                        "spconv_context_create: 'out' is NULL");
    ctx = (spconv_context *)(uintptr_t)0x10;
    SPCONV_ASSERT_FAILS(spconv_context_create((spconv_device){SPCONV_DEVICE_CPU, 2}, &ctx),
                        SPCONV_ERR_INVALID_ARGUMENT, "CPU device index must be 0, got 2");
    assert_null(ctx);
}

static void test_workspace(void **state) {
    (void)state;
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    void *first = NULL, *again = NULL, *grown = NULL;
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 100, &first));
    assert_non_null(first);
    memset(first, 1, 100);
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 50, &again));
    assert_ptr_equal(again, first); /* smaller requests reuse it */
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 1 << 20, &grown));
    assert_non_null(grown);
    memset(grown, 2, 1 << 20); /* the whole request is usable */
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 0, &again));
    assert_ptr_equal(again, grown);
    SPCONV_ASSERT_FAILS(spconv_context_workspace(ctx, 8, NULL), SPCONV_ERR_NULL_POINTER,
                        "spconv_context_workspace: 'ptr' is NULL");
    void *huge = (void *)(uintptr_t)0x10;
    SPCONV_ASSERT_FAILS(spconv_context_workspace(ctx, (size_t)1 << 62, &huge),
                        SPCONV_ERR_OUT_OF_MEMORY, "out of host memory");
    assert_null(huge);
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 10, &again)); /* the old one survives */
    assert_ptr_equal(again, grown);
    spconv_context_destroy(ctx);
}

static void test_version_and_build(void **state) {
    (void)state;
    assert_int_equal(spconv_version(), SPCONV_VERSION_NUMBER);
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", SPCONV_VERSION_MAJOR, SPCONV_VERSION_MINOR,
             SPCONV_VERSION_PATCH);
    assert_string_equal(spconv_version_string(), expected);
    assert_int_equal(spconv_has_cuda(), SPCONV_HAVE_CUDA);
    spconv_clear_error();
    int devices = spconv_cuda_device_count();
    assert_true(devices >= 0);
    if (!spconv_has_cuda()) assert_int_equal(devices, 0);
    assert_string_equal(spconv_last_error(), ""); /* no device is not an error */
    char report[1024];
    spconv_build_report(report, sizeof report);
    assert_non_null(strstr(report, spconv_version_string()));
    assert_non_null(strstr(report, "CUDA backend: "));
    assert_non_null(strstr(report, SPCONV_HAVE_CUDA ? "built" : "not built"));
    /* The emulated backend's device must never pass for a GPU. */
    if (SPCONV_CUDA_EMULATION) {
        assert_int_equal(devices, 1);
        assert_non_null(strstr(report, "host emulation"));
        assert_non_null(strstr(report, "no GPU"));
    } else {
        assert_null(strstr(report, "emulat"));
    }
    assert_non_null(strstr(report, "BLAS: "));
    char tiny[8];
    spconv_build_report(tiny, sizeof tiny);
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
    spconv_build_report(NULL, 0);
}

static void test_context_cuda(void **state) {
    (void)state;
    spconv_context *ctx = (spconv_context *)(uintptr_t)0x10;
    if (spconv_cuda_device_count() > 0) {
        printf("note: a CUDA device is present; creating a context on it\n");
        SPCONV_ASSERT_OK(spconv_context_create(spconv_cuda(0), &ctx));
        spconv_context_destroy(ctx);
    } else {
        SPCONV_ASSERT_FAILS(spconv_context_create(spconv_cuda(0), &ctx), SPCONV_ERR_NO_DEVICE,
                            "spconv_context_create: ");
        SPCONV_ASSERT_ERROR_CONTAINS(spconv_has_cuda() ? "CUDA device 0 is not present"
                                                       : "this build of spconv has no CUDA backend");
        assert_null(ctx);
    }
    ctx = (spconv_context *)(uintptr_t)0x10;
    SPCONV_ASSERT_FAILS(spconv_context_create(spconv_cuda(-1), &ctx), SPCONV_ERR_NO_DEVICE,
                        "spconv_context_create: ");
    assert_null(ctx);
    ctx = (spconv_context *)(uintptr_t)0x10;
    SPCONV_ASSERT_FAILS(spconv_context_create((spconv_device){(spconv_device_type)7, 0}, &ctx),
                        SPCONV_ERR_INVALID_ARGUMENT, "spconv_context_create: unknown device type 7");
    assert_null(ctx);
}

int main(void) {
    const struct CMUnitTest errors[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_last_error),
        cmocka_unit_test(test_last_error_is_per_thread),
    };
    const struct CMUnitTest contexts[] = {
        cmocka_unit_test(test_context_cpu),
        cmocka_unit_test(test_workspace),
        cmocka_unit_test(test_context_cuda),
    };
    const struct CMUnitTest build[] = {
        cmocka_unit_test(test_version_and_build),
    };
    int failures = 0;
    failures += cmocka_run_group_tests_name("errors", errors, NULL, NULL);
    failures += cmocka_run_group_tests_name("contexts", contexts, NULL, NULL);
    failures += cmocka_run_group_tests_name("build", build, NULL, NULL);
    return failures == 0 ? 0 : 1;
}
