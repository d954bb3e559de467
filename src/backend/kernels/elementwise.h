/* Kernel bodies of the element-wise family: the unary functions and their
 * derivatives, the binary operators, and a row's max and logsumexp. Part of
 * backend/kernels.h (include that: it defines LK_KERNEL). */
#ifndef LK_KERNELS_ELEMENTWISE_H
#define LK_KERNELS_ELEMENTWISE_H

#define LK_UNARY_LIST(X)                                                         \
    X(RELU) X(GELU_TANH) X(GELU_EXACT) X(TANH) X(SIGMOID) X(EXP) X(LOG) X(SQRT) \
    X(ABS) X(LEAKY_RELU) X(ELU) X(SILU) X(NEG)

typedef enum {
#define LK__UNARY_ENUM(name) LK_UNARY_##name,
    LK_UNARY_LIST(LK__UNARY_ENUM)
#undef LK__UNARY_ENUM
    LK_UNARY_COUNT
} lk_unary_op;

#define LK_SQRT_2_OVER_PI 0.7978845608028654f
#define LK_GELU_COEF 0.044715f
#define LK_INV_SQRT_2 0.7071067811865476f

LK_KERNEL float lk_k_expf(float x); /* rows.h */

/* The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2, exact GELU's
 * factor, and with it the density phi(x) = exp(-x^2 / 2) / sqrt(2 pi) (into
 * *pdf): erfc(a) for a = |x| / sqrt 2 as t P(t) exp(-a^2), t = 1 / (1 +
 * 0.3275911 a), P of degree 4 — Abramowitz and Stegun's 7.1.26, absolute
 * error below 1.5e-7, the form PyTorch's vectorised erf takes, so GELU
 * follows torch's own digits. exp(-a^2) is exp(-x^2 / 2), the density's
 * exponential too: GELU's backward needs one lk_k_expf per element, not
 * two (with the Numerical Recipes erfc fit used before, GELU forward and
 * backward were 12% of a small GPT's step, bench/results/HISTORY.md).
 * Plain arithmetic that vectorises; libm's erff is a call per element. */
LK_KERNEL float lk_k_normal_cdf_pdf(float x, float *pdf) {
    float a = fabsf(x) * LK_INV_SQRT_2;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = 1.061405429f;
    p = -1.453152027f + t * p;
    p = 1.421413741f + t * p;
    p = -0.284496736f + t * p;
    p = 0.254829592f + t * p;
    float u = lk_k_expf(-a * a);
    float h = 0.5f * t * p * u; /* erfc(a) / 2 */
    *pdf = 0.3989422804014327f * u;
    return x >= 0.0f ? 1.0f - h : h;
}

LK_KERNEL float lk_k_normal_cdf(float x) {
    float pdf;
    return lk_k_normal_cdf_pdf(x, &pdf);
}

/* y = f(x); alpha is the op's parameter (leaky slope, elu alpha). */
LK_KERNEL float lk_k_unary(int op, float x, float alpha) {
    switch (op) {
    case LK_UNARY_RELU: return x > 0.0f ? x : 0.0f;
    case LK_UNARY_GELU_TANH: {
        float u = LK_SQRT_2_OVER_PI * (x + LK_GELU_COEF * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    case LK_UNARY_GELU_EXACT: return x * lk_k_normal_cdf(x);
    case LK_UNARY_TANH: return tanhf(x);
    case LK_UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case LK_UNARY_EXP: return expf(x);
    case LK_UNARY_LOG: return logf(x);
    case LK_UNARY_SQRT: return sqrtf(x);
    case LK_UNARY_ABS: return fabsf(x);
    case LK_UNARY_LEAKY_RELU: return x > 0.0f ? x : alpha * x;
    case LK_UNARY_ELU: return x > 0.0f ? x : alpha * (expf(x) - 1.0f);
    case LK_UNARY_SILU: return x / (1.0f + expf(-x));
    case LK_UNARY_NEG: return -x;
    default: return x;
    }
}

/* dy/dx given x and y = f(x) (whichever is cheaper to use). */
LK_KERNEL float lk_k_unary_grad(int op, float x, float y, float alpha) {
    switch (op) {
    case LK_UNARY_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case LK_UNARY_GELU_TANH: {
        float u = LK_SQRT_2_OVER_PI * (x + LK_GELU_COEF * x * x * x);
        float t = tanhf(u);
        float du = LK_SQRT_2_OVER_PI * (1.0f + 3.0f * LK_GELU_COEF * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case LK_UNARY_GELU_EXACT: {
        float pdf, cdf = lk_k_normal_cdf_pdf(x, &pdf);
        return cdf + x * pdf;
    }
    case LK_UNARY_TANH: return 1.0f - y * y;
    case LK_UNARY_SIGMOID: return y * (1.0f - y);
    case LK_UNARY_EXP: return y;
    case LK_UNARY_LOG: return 1.0f / x;
    case LK_UNARY_SQRT: return 0.5f / y;
    case LK_UNARY_ABS: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case LK_UNARY_LEAKY_RELU: return x > 0.0f ? 1.0f : alpha;
    case LK_UNARY_ELU: return x > 0.0f ? 1.0f : y + alpha;
    case LK_UNARY_SILU: {
        float s = 1.0f / (1.0f + expf(-x));
        return s * (1.0f + x * (1.0f - s));
    }
    case LK_UNARY_NEG: return -1.0f;
    default: return 1.0f;
    }
}

typedef enum { LK_BINARY_ADD, LK_BINARY_SUB, LK_BINARY_MUL, LK_BINARY_DIV } lk_binary_op;

LK_KERNEL float lk_k_binary(int op, float a, float b) {
    switch (op) {
    case LK_BINARY_ADD: return a + b;
    case LK_BINARY_SUB: return a - b;
    case LK_BINARY_MUL: return a * b;
    default: return a / b;
    }
}

/* Numerically stable log(sum(exp(x))) over a row, and the softmax of it. */
LK_KERNEL float lk_k_row_max(const float *x, long n) {
    float m = -INFINITY;
    for (long i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

LK_KERNEL float lk_k_row_logsumexp(const float *x, long n) {
    float m = lk_k_row_max(x, n);
    if (m == -INFINITY) return m;
    float s = 0.0f;
    for (long i = 0; i < n; i++) s += expf(x[i] - m);
    return m + logf(s);
}

#endif
