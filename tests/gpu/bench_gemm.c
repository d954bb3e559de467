/* GEMM rates through the cuBLASLt path (lk__cuda_gemm_run) as CSV on stdout:
 * the mlp's and autoencoder's layer shapes at batch 256 and 1024 (forward
 * NN, backward NT and TN) and a large square product for the peak, in f32,
 * TF32, bf16 and f16. Each row: the median of 20 timed calls after 5 warm-up
 * calls, CUDA events around each, recorded on the GPU's compute stream
 * (the GEMM runs there; the legacy stream 0 is not ordered with it). Not a test: tools/gpu/session.sh runs it
 * on a GPU machine. Exits 77 without a GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/gemm.h"
#include "gpu_test.h"

static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void row(const char *what, lk_dtype ab, unsigned flags, bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    lk_device g = {LK_CUDA, 0};
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {ab, ab, LK_F32}};
    d.gemm = (lk_gemm_params){ta, tb, M, N, K, ta ? M : K, tb ? K : N, N, 1, 0};
    size_t e = lk_dtype_size(ab);
    void *A, *B, *C;
    if (lk_device_alloc(g, (size_t)(M * K) * e, &A) || lk_device_alloc(g, (size_t)(K * N) * e, &B) ||
        lk_device_alloc(g, (size_t)(M * N) * 4, &C)) {
        fprintf(stderr, "%s\n", lk_last_error());
        exit(1);
    }
    lk_device_memset(g, A, 0x3c, (size_t)(M * K) * e); /* small finite values in every dtype */
    lk_device_memset(g, B, 0x3c, (size_t)(K * N) * e);
    void *ops[3] = {A, B, C};
    cudaStream_t s;
    if (lk__cuda_stream(0, &s)) {
        fprintf(stderr, "%s\n", lk_last_error());
        exit(1);
    }
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0), cudaEventCreate(&t1);
    float ms[20];
    for (int i = 0; i < 25; i++) {
        cudaEventRecord(t0, s);
        if (lk__cuda_gemm_run(0, &d, ops, flags)) {
            fprintf(stderr, "%s\n", lk_last_error());
            exit(1);
        }
        cudaEventRecord(t1, s);
        cudaEventSynchronize(t1);
        if (i >= 5) cudaEventElapsedTime(&ms[i - 5], t0, t1);
    }
    qsort(ms, 20, sizeof ms[0], cmp);
    double med = (ms[9] + ms[10]) / 2;
    printf("%s,%s%s,%s%s,%lld,%lld,%lld,%.4f,%.2f\n", what, lk_dtype_name(ab), flags ? "-tf32" : "", ta ? "T" : "N",
           tb ? "T" : "N", (long long)M, (long long)N, (long long)K, med * 1e3, 2.0 * M * N * K / (med * 1e-3) / 1e12);
    cudaEventDestroy(t0), cudaEventDestroy(t1);
    lk_device_free(g, A, 0), lk_device_free(g, B, 0), lk_device_free(g, C, 0);
}

int main(void) {
    gpu_test_require();
    printf("what,dtype,op,M,N,K,median_us,tflops\n");
    static const struct {
        const char *what;
        int64_t in, out;
    } layers[] = {{"mlp 784->512", 784, 512}, {"mlp 512->10", 512, 10}, {"ae 784->256", 784, 256}, {"ae 256->784", 256, 784}};
    static const lk_dtype dts[] = {LK_F32, LK_F32, LK_BF16, LK_F16};
    static const unsigned fl[] = {0, LK__CUDA_GEMM_TF32, 0, 0};
    for (int b = 256; b <= 1024; b *= 4)
        for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++)
            for (int t = 0; t < 4; t++) {
                char w[64];
                snprintf(w, sizeof w, "%s b%d fwd", layers[l].what, b);
                row(w, dts[t], fl[t], false, true, b, layers[l].out, layers[l].in); /* y = x W^T */
                snprintf(w, sizeof w, "%s b%d dW", layers[l].what, b);
                row(w, dts[t], fl[t], true, false, layers[l].out, layers[l].in, b); /* dW = dy^T x */
            }
    for (int t = 0; t < 4; t++) row("peak 8192^3", dts[t], fl[t], false, false, 8192, 8192, 8192);
    return 0;
}
