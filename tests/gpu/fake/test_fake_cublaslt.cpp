/* The fake cuBLASLt (fake_cublaslt.cpp) on its own, over stub_runtime.cpp:
 * loaded as gemm.c loads it (dlopen of libcublasLt.so.<CUBLAS_VER_MAJOR>
 * through LD_LIBRARY_PATH, which the test's environment points at the
 * fake's directory), then
 *  - every transpose combination x {f32, tf32, bf16->f32, bf16->bf16,
 *    f16->f32, f16->f16} x beta {0, 1.5} against a double reference, with
 *    leading dimensions larger than the rows, NaN in the padding and, for
 *    beta 0, in C (never read), and D's padding checked untouched;
 *  - alpha and beta read at call time, the work done at sync time;
 *  - each refusal the fake promises, by status.
 * Tolerance, per element: (k + 2) * 2^-24 * (|alpha| sum |a b| + |beta c|)
 * for the f32 accumulation, plus half an ulp of the output type (2^-8
 * relative for bf16, 2^-11 for f16). The tf32 reference rounds its inputs
 * to 11 significant bits itself, so a fake that skipped the rounding fails. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include <cublasLt.h>

extern "C" void *lk_stub_alloc(size_t n, int device); /* stub_runtime.cpp */
extern "C" void lk_stub_copy(void *dst, const void *src, size_t n);
extern "C" int lk_stub_sync(void);

#define STR_(x) #x
#define STR(x) STR_(x)

#define LT_FUNCS(X)                                                                                                    \
    X(cublasLtCreate)                                                                                                  \
    X(cublasLtDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulDescDestroy)      \
        X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)                 \
            X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulPreferenceDestroy)                                 \
                X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
static struct {
#define X(f) decltype(&::f) f;
    LT_FUNCS(X)
#undef X
} lt;

static int failures;
#define CHECK(c, ...)                                                                                                  \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                                               \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

/* ---- values in each type, converted independently of the fake ------------ */
static size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
/* x rounded to `bits` significant bits, nearest even (x well inside the normal range). */
static double round_sig(double x, int bits) {
    if (x == 0) return 0;
    int e;
    frexp(x, &e);
    return nearbyint(ldexp(x, bits - e)) * ldexp(1.0, e - bits);
}
/* Small multiples of powers of two, exact in every type; f32's carry two
 * more bits, 2^-12 and 2^-20 below the leading one, which TF32 drops. */
static double value(int i, cudaDataType_t t) {
    double v = ldexp((double)((i * 37 + 11) % 29 - 14), -((i * 13) % 5));
    return t == CUDA_R_32F ? v * (1 + 0x1p-12 + 0x1p-20) : v;
}
static void put(std::vector<unsigned char> &buf, cudaDataType_t t, size_t i, double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (t == CUDA_R_32F)
        memcpy(&buf[i * 4], &f, 4);
    else {
        uint16_t h;
        if (t == CUDA_R_16BF)
            h = (uint16_t)(u >> 16); /* callers pass bf16-exact values or NaN */
        else if (isnan(f))
            h = 0x7e00;
        else { /* f16 from an f16-exact normal or zero value */
            int e;
            double m = frexp(fabs(v), &e);
            h = v == 0 ? 0 : (uint16_t)(((e + 14) << 10) | ((uint32_t)ldexp(m, 11) & 0x3ff));
            if (v < 0) h |= 0x8000;
        }
        memcpy(&buf[i * 2], &h, 2);
    }
}
static double get(const std::vector<unsigned char> &buf, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) {
        float f;
        memcpy(&f, &buf[i * 4], 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, &buf[i * 2], 2);
    if (t == CUDA_R_16BF) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 0x3ff;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

/* ---- one problem: descriptors, the heuristic and the matmul --------------- */
struct Lay {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct Problem {
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = CUDA_R_32F;
    int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    Lay L[4];
    uint32_t align[4] = {256, 256, 256, 256};
    const void *A, *B, *C;
    void *D;
    float alpha = 1, beta = 0;
    void *ws = nullptr;
    size_t ws_bytes = 0;
    void *stream = (void *)0x1;
    bool null_algo = false, null_handle = false;
    const cublasLtMatmulAlgo_t *algo = nullptr; /* used when the heuristic refuses */
};
struct Result {
    cublasStatus_t heur, mm;
    cublasLtMatmulAlgo_t algo;
};

static cublasLtHandle_t handle;

static Result run(Problem &p) {
    Result r{};
    cublasLtMatmulDesc_t md;
    cublasLtMatrixLayout_t l[4];
    cublasLtMatmulPreference_t pref;
    CHECK(!lt.cublasLtMatmulDescCreate(&md, p.compute, p.scale), "desc");
    CHECK(!lt.cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof p.ta), "transa");
    CHECK(!lt.cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof p.tb), "transb");
    for (int i = 0; i < 4; i++)
        CHECK(!lt.cublasLtMatrixLayoutCreate(&l[i], p.L[i].type, p.L[i].rows, p.L[i].cols, p.L[i].ld), "layout");
    CHECK(!lt.cublasLtMatmulPreferenceCreate(&pref), "pref");
    uint64_t ws = p.ws_bytes;
    CHECK(!lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
          "ws");
    for (int i = 0; i < 4; i++)
        CHECK(!lt.cublasLtMatmulPreferenceSetAttribute(
                  pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
                  &p.align[i], sizeof p.align[i]),
              "align");
    cublasLtMatmulHeuristicResult_t heur;
    int found = -1;
    cublasLtHandle_t hd = p.null_handle ? nullptr : handle;
    r.heur = lt.cublasLtMatmulAlgoGetHeuristic(hd, md, l[0], l[1], l[2], l[3], pref, 1, &heur, &found);
    if (!r.heur) {
        CHECK(found == 1 && heur.state == CUBLAS_STATUS_SUCCESS && heur.workspaceSize == 0, "heuristic result");
        r.algo = heur.algo;
    } else if (p.algo)
        r.algo = *p.algo;
    r.mm = lt.cublasLtMatmul(hd, md, &p.alpha, p.A, l[0], p.B, l[1], &p.beta, p.C, l[2], p.D, l[3],
                             p.null_algo ? nullptr : &r.algo, p.ws, p.ws_bytes, (cudaStream_t)p.stream);
    p.alpha = p.beta = NAN; /* read at call time: the queued work must not see these */
    lt.cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < 4; i++) lt.cublasLtMatrixLayoutDestroy(l[i]);
    lt.cublasLtMatmulDescDestroy(md);
    return r;
}

/* ---- the numeric cases ---------------------------------------------------- */
struct Types {
    const char *name;
    cudaDataType_t ab, c;
    cublasComputeType_t compute;
};

static void numeric(const Types &ty, int32_t ta, int32_t tb, float beta) {
    const uint64_t m = 5, n = 7, k = 9;
    Problem p;
    p.compute = ty.compute, p.ta = ta, p.tb = tb, p.alpha = 0.75f, p.beta = beta;
    uint64_t ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    uint64_t br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    p.L[0] = {ty.ab, ar, ac, (int64_t)ar + 2};
    p.L[1] = {ty.ab, br, bc, (int64_t)br + 3};
    p.L[2] = p.L[3] = {ty.c, m, n, (int64_t)m + 1};
    std::vector<unsigned char> h[3];
    void *dev[3];
    for (int i = 0; i < 3; i++) {
        const Lay &l = p.L[i];
        h[i].resize(l.ld * l.cols * esize(l.type));
        for (uint64_t j = 0; j < l.ld * l.cols; j++) /* NaN in the padding, and in C when beta is 0 */
            put(h[i], l.type, j,
                (j % l.ld) >= l.rows || (i == 2 && beta == 0) ? NAN : value((int)(j + 100 * i), l.type));
        dev[i] = lk_stub_alloc(h[i].size(), 0);
        lk_stub_copy(dev[i], h[i].data(), h[i].size());
    }
    p.A = dev[0], p.B = dev[1], p.C = dev[2], p.D = dev[2];
    Result r = run(p);
    CHECK(r.heur == CUBLAS_STATUS_SUCCESS && r.mm == CUBLAS_STATUS_SUCCESS, "%s: statuses %d %d", ty.name, r.heur,
          r.mm);
    CHECK(lk_stub_sync() == 1, "%s: one queued matmul", ty.name);
    std::vector<unsigned char> out(h[2].size());
    lk_stub_copy(out.data(), dev[2], out.size());
    bool tf32 = ty.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    double out_eps = ty.c == CUDA_R_16BF ? 0x1p-8 : ty.c == CUDA_R_16F ? 0x1p-11 : 0;
    int bad = 0;
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < (uint64_t)p.L[2].ld; i++) {
            uint64_t ci = i + j * p.L[2].ld;
            double got = get(out, ty.c, ci);
            if (i >= m) { /* padding: untouched */
                bad += memcmp(&out[ci * esize(ty.c)], &h[2][ci * esize(ty.c)], esize(ty.c)) != 0;
                continue;
            }
            double ref = 0, mag = 0;
            for (uint64_t q = 0; q < k; q++) {
                double a = get(h[0], ty.ab, ta == CUBLAS_OP_N ? i + q * p.L[0].ld : q + i * p.L[0].ld);
                double b = get(h[1], ty.ab, tb == CUBLAS_OP_N ? q + j * p.L[1].ld : j + q * p.L[1].ld);
                if (tf32) a = round_sig(a, 11), b = round_sig(b, 11);
                ref += a * b, mag += fabs(a * b);
            }
            ref *= 0.75, mag *= 0.75;
            if (beta != 0) {
                double c = get(h[2], ty.c, ci);
                ref += beta * c, mag += fabs(beta * c);
            }
            double tol = (k + 2) * 0x1p-24 * mag + out_eps * fabs(ref);
            if (!(fabs(got - ref) <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s ta %d tb %d beta %g: D(%llu,%llu) = %.9g, want %.9g +- %.3g\n", ty.name, ta,
                            tb, beta, (unsigned long long)i, (unsigned long long)j, got, ref, tol);
            }
        }
    CHECK(bad == 0, "%s ta %d tb %d beta %g: %d elements wrong", ty.name, ta, tb, beta, bad);
}

/* ---- refusals --------------------------------------------------------------- */
static void refusals(void) {
    /* A base problem that runs: f32, m 4, n 3, k 2, no transposes. */
    float *buf = (float *)lk_stub_alloc(4096, 0), *other_gpu = (float *)lk_stub_alloc(4096, 1);
    alignas(256) static float host[256]; /* host memory, aligned as any promise */
    Problem base;
    base.L[0] = {CUDA_R_32F, 4, 2, 4};
    base.L[1] = {CUDA_R_32F, 2, 3, 2};
    base.L[2] = base.L[3] = {CUDA_R_32F, 4, 3, 4};
    base.A = buf, base.B = buf + 256, base.C = base.D = buf + 512;
    Problem q = base;
    Result good = run(q);
    CHECK(!good.heur && !good.mm, "the base problem: %d %d", good.heur, good.mm);
    lk_stub_sync();
    struct Case {
        const char *what;
        Problem p;
        cublasStatus_t heur, mm;
    };
    std::vector<Case> cases;
    auto add = [&](const char *what, cublasStatus_t heur, cublasStatus_t mm, auto edit) {
        Case c{what, base, heur, mm};
        c.p.algo = &good.algo;
        edit(c.p);
        cases.push_back(c);
    };
    const cublasStatus_t OK = CUBLAS_STATUS_SUCCESS, INV = CUBLAS_STATUS_INVALID_VALUE,
                         NS = CUBLAS_STATUS_NOT_SUPPORTED;
    add("A's ld < rows", INV, INV, [](Problem &p) { p.L[0].ld = 3; });
    add("C's ld 0", INV, INV, [](Problem &p) { p.L[2].ld = p.L[3].ld = 0; });
    add("op(A) rows != C rows", INV, INV, [](Problem &p) { p.ta = CUBLAS_OP_T; });
    add("op(B) cols != C cols", INV, INV, [](Problem &p) {
        p.L[1].cols = 4;
        p.L[1].ld = 2;
    });
    add("inner dims differ", INV, INV, [](Problem &p) { p.L[1].rows = 1; });
    add("C and D layouts differ", INV, INV, [](Problem &p) { p.L[3].ld = 5; });
    add("A f32, B bf16", NS, NS, [](Problem &p) { p.L[1].type = CUDA_R_16BF; });
    add("f32 with a bf16 C", NS, NS, [](Problem &p) { p.L[2].type = p.L[3].type = CUDA_R_16BF; });
    add("f16 with a bf16 C", NS, NS, [](Problem &p) {
        p.L[0].type = p.L[1].type = CUDA_R_16F;
        p.L[2].type = p.L[3].type = CUDA_R_16BF;
    });
    add("bf16 with TF32 compute", NS, NS, [](Problem &p) {
        p.L[0].type = p.L[1].type = CUDA_R_16BF;
        p.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    });
    add("f64 scale", NS, NS, [](Problem &p) { p.scale = CUDA_R_64F; });
    add("f64 matrices", NS, NS, [](Problem &p) {
        for (Lay &l : p.L) l.type = CUDA_R_64F;
    });
    add("workspace size without a workspace", OK, INV, [](Problem &p) { p.ws_bytes = 1024; });
    add("workspace in host memory", OK, INV, [&](Problem &p) { p.ws_bytes = 1024, p.ws = host; });
    add("workspace in device memory", OK, OK, [&](Problem &p) { p.ws_bytes = 1024, p.ws = buf + 768; });
    add("algo NULL", OK, INV, [](Problem &p) { p.null_algo = true; });
    add("B less aligned than promised", OK, INV, [&](Problem &p) { p.B = buf + 260; });
    add("B aligned as promised (16)", OK, OK, [&](Problem &p) { p.B = buf + 260, p.align[1] = 16; });
    add("alignment promise below the element (the matmul runs with the base's algo)", NS, OK,
        [&](Problem &p) { p.align[0] = 2; });
    add("A in host memory", OK, INV, [&](Problem &p) { p.A = host; });
    add("C past its allocation's end", OK, INV,
        [&](Problem &p) { p.C = p.D = buf + 1020, p.align[2] = p.align[3] = 16; });
    add("C in host memory but beta 0: not read", OK, OK, [&](Problem &p) { p.C = host; });
    add("C in host memory, beta 1", OK, INV, [&](Problem &p) { p.C = host, p.beta = 1; });
    add("NULL handle", INV, INV, [](Problem &p) { p.null_handle = true; });
    add("D on another GPU", OK, INV, [&](Problem &p) { p.C = p.D = other_gpu; });
    add("NULL stream", OK, CUBLAS_STATUS_EXECUTION_FAILED, [](Problem &p) { p.stream = nullptr; });
    for (Case &c : cases) {
        Result r = run(c.p);
        CHECK(r.heur == c.heur && r.mm == c.mm, "%s: heuristic %d (want %d), matmul %d (want %d)", c.what, r.heur,
              c.heur, r.mm, c.mm);
        int ran = lk_stub_sync();
        CHECK(ran == (c.mm == OK), "%s: %d matmuls queued", c.what, ran);
    }

    /* Dead and NULL objects, wrong attribute sizes. */
    cublasLtMatrixLayout_t dead;
    lt.cublasLtMatrixLayoutCreate(&dead, CUDA_R_32F, 4, 4, 4);
    lt.cublasLtMatrixLayoutDestroy(dead);
    cublasLtMatmulDesc_t md;
    lt.cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    float one = 1, zero = 0;
    CHECK(lt.cublasLtMatmul(handle, md, &one, buf, dead, buf, dead, &zero, buf, dead, buf, dead, &good.algo, nullptr, 0,
                            (cudaStream_t)1) == INV,
          "a destroyed layout");
    int64_t op64 = CUBLAS_OP_T;
    int32_t bad_op = 7;
    CHECK(lt.cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &op64, sizeof op64) == INV,
          "8-byte TRANSA");
    CHECK(lt.cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &bad_op, sizeof bad_op) == INV,
          "TRANSA 7");
    CHECK(lt.cublasLtMatmulDescSetAttribute(nullptr, CUBLASLT_MATMUL_DESC_TRANSA, &bad_op, 4) == INV,
          "NULL descriptor");
    lt.cublasLtMatmulDescDestroy(md);
    cublasLtMatmulPreference_t pref;
    lt.cublasLtMatmulPreferenceCreate(&pref);
    uint32_t ws32 = 0;
    CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32, sizeof ws32) ==
              INV,
          "4-byte MAX_WORKSPACE_BYTES");
    lt.cublasLtMatmulPreferenceDestroy(pref);
    CHECK(lk_stub_sync() == 0, "nothing queued by the refusals");
}

int main(void) {
    const char *name = "libcublasLt.so." STR(CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL: cannot load %s: %s\n", name, dlerror());
        return 1;
    }
#define X(f)                                                                                                           \
    if (!(*(void **)&lt.f = dlsym(h, #f))) {                                                                           \
        fprintf(stderr, "FAIL: %s has no %s\n", name, #f);                                                             \
        return 1;                                                                                                      \
    }
    LT_FUNCS(X)
#undef X
    Dl_info info;
    if (!dladdr((void *)lt.cublasLtMatmul, &info) || !strstr(info.dli_fname, "fakegpu-lib")) {
        fprintf(stderr, "FAIL: %s resolved to %s, not the fake's\n", name, info.dli_fname ? info.dli_fname : "?");
        return 1;
    }
    CHECK(!lt.cublasLtCreate(&handle), "create");
    static const Types types[] = {{"f32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
                                  {"tf32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
                                  {"bf16->f32", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
                                  {"bf16->bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
                                  {"f16->f32", CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
                                  {"f16->f16", CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F}};
    int n = 0;
    for (const Types &t : types)
        for (int32_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
            for (int32_t tb : {CUBLAS_OP_N, CUBLAS_OP_T})
                for (float beta : {0.0f, 1.5f}) numeric(t, ta, tb, beta), n++;
    refusals();
    CHECK(!lt.cublasLtDestroy(handle), "destroy");
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("fake cuBLASLt: %d numeric cases and the refusals pass\n", n);
    return 0;
}
