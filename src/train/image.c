/* PNG image grids (reconstructions.png and friends): grayscale images in
 * [0, 1] laid out in a grid with mid-gray separators, encoded by
 * stb_image_write. The stb implementation is compiled into this one file,
 * static, so the library needs no extra link line; its allocations go
 * through lk_malloc and its output through a callback into our buffer, which
 * is then written atomically (temporary file + rename). */
#include <math.h>
#include <string.h>

#include "train/loggers.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#define STBIW_MALLOC(sz) lk_malloc(sz)
#define STBIW_REALLOC(p, sz) lk_realloc(p, sz)
#define STBIW_FREE(p) lk_free(p)
#define STBIW_ASSERT(x) LK_ASSERT(x)
#if defined(__GNUC__)
/* The unused BMP/TGA/HDR/JPEG writers: compilers report these at the end of
 * the file, so this one stays off for the whole (small) file. */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#endif
#include <stb/stb_image_write.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#define SEPARATOR_GRAY 128
#define MAX_SIDE 32768

typedef struct {
    unsigned char *p;
    size_t len, cap;
    int oom;
} png_buf;

static void png_collect(void *ctx, void *data, int size) {
    png_buf *b = ctx;
    if (b->oom || size <= 0) return;
    if (lk_vec_reserve(b->p, b->cap, b->len + (size_t)size, 4096)) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

static unsigned char to_byte(float v) {
    if (!(v > 0)) return 0; /* NaN and negatives: black */
    if (v >= 1) return 255;
    return (unsigned char)lrintf(v * 255.0f);
}

/* A 5x7 bitmap of the lowercase letters the labels use (a row per byte,
 * bit 4 the leftmost pixel); other characters are left blank. */
static const struct {
    char c;
    unsigned char row[7];
} glyphs[] = {
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x10, 0x0E}}, {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, {'p', {0x00, 0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10}},
    {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}}, {'s', {0x00, 0x00, 0x0F, 0x10, 0x0E, 0x01, 0x1E}},
    {'t', {0x08, 0x08, 0x1E, 0x08, 0x08, 0x09, 0x06}}, {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}},
};

/* Writes `text` in black at (x0, y0) of the W-wide image, each font pixel
 * ts x ts, clipped to the image's width. */
static void draw_text(unsigned char *px, int64_t W, int64_t x0, int64_t y0, const char *text, int ts) {
    for (int k = 0; text[k]; k++) {
        const unsigned char *row = NULL;
        for (size_t g = 0; g < sizeof glyphs / sizeof glyphs[0]; g++)
            if (glyphs[g].c == text[k]) row = glyphs[g].row;
        for (int y = 0; row && y < 7 * ts; y++)
            for (int x = 0; x < 5 * ts; x++) {
                int64_t X = x0 + (int64_t)k * 6 * ts + x;
                if (X < W && (row[y / ts] >> (4 - x / ts) & 1)) px[(y0 + y) * W + X] = 0;
            }
    }
}

/* img[i] is image i ([h, w] row-major); NULL draws an empty (gray) cell.
 * labels (NULL: none) names each row of the grid in a band above it. */
static lk_status grid_png_labeled(const char *path, const float *const *img, int n, int h, int w, int cols, int scale,
                                  int pad, const char *const *labels);
static lk_status grid_png(const char *path, const float *const *img, int n, int h, int w, int cols, int scale,
                          int pad) {
    return grid_png_labeled(path, img, n, h, w, cols, scale, pad, NULL);
}

static lk_status grid_png_labeled(const char *path, const float *const *img, int n, int h, int w, int cols, int scale,
                                  int pad, const char *const *labels) {
    if (!path || !path[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "image grid: empty path");
    if (n <= 0 || h <= 0 || w <= 0 || cols <= 0 || scale <= 0 || scale > 64 || pad < 0 || pad > 64)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "image grid %s: n=%d h=%d w=%d cols=%d scale=%d pad=%d; expected n, h, w, cols > 0, "
                        "scale in [1, 64], pad in [0, 64]",
                        path, n, h, w, cols, scale, pad);
    if (cols > n) cols = n;
    int rows = (n + cols - 1) / cols;
    int64_t cw = (int64_t)w * scale, ch = (int64_t)h * scale;
    int64_t band = labels ? 7 * scale + pad : 0; /* a row's label: 7 font pixels of scale x scale */
    int64_t W = pad + cols * (cw + pad), H = pad + rows * (band + ch + pad);
    if (W > MAX_SIDE || H > MAX_SIDE)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "image grid %s: %lldx%lld pixels, expected at most %d per side",
                        path, (long long)W, (long long)H, MAX_SIDE);
    unsigned char *px = lk_malloc((size_t)(W * H));
    if (!px) return lk_last_status();
    memset(px, SEPARATOR_GRAY, (size_t)(W * H));
    for (int i = 0; i < n; i++) {
        if (!img[i]) continue;
        int64_t x0 = pad + (i % cols) * (cw + pad), y0 = pad + (i / cols) * (band + ch + pad) + band;
        for (int64_t y = 0; y < ch; y++) {
            const float *src = img[i] + (y / scale) * w;
            unsigned char *dst = px + (y0 + y) * W + x0;
            for (int64_t x = 0; x < cw; x++) dst[x] = to_byte(src[x / scale]);
        }
    }
    for (int r = 0; labels && r < rows; r++)
        if (labels[r]) draw_text(px, W, pad, pad + r * (band + ch + pad), labels[r], scale);
    png_buf out = {0};
    int ok = stbi_write_png_to_func(png_collect, &out, (int)W, (int)H, 1, px, (int)W);
    lk_free(px);
    lk_status st = LK_STATUS_OK;
    if (!ok || out.oom) st = lk_error(LK_STATUS_OUT_OF_MEMORY, "image grid %s: cannot encode %lldx%lld PNG", path,
                                      (long long)W, (long long)H);
    else st = lk_file_write_atomic(path, out.p, out.len);
    lk_free(out.p);
    return st;
}

lk_status lk_image_grid_png(const char *path, const float *images, int n, int h, int w, int cols, int scale,
                            int pad) {
    if (!images) return lk_error(LK_STATUS_INVALID_ARGUMENT, "image grid %s: images is NULL", path ? path : "");
    if (n <= 0 || h <= 0 || w <= 0) return grid_png(path, NULL, n, h, w, cols, scale, pad); /* reports */
    const float **img = lk_malloc((size_t)n * sizeof *img);
    if (!img) return lk_last_status();
    for (int i = 0; i < n; i++) img[i] = images + (size_t)i * (size_t)h * (size_t)w;
    lk_status st = grid_png(path, img, n, h, w, cols, scale, pad);
    lk_free((void *)img);
    return st;
}

lk_status lk_image_recon_png(const char *path, const float *originals, const float *recons, int n, int h, int w,
                             int scale) {
    if (!originals || !recons)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "reconstruction grid %s: images are NULL", path ? path : "");
    if (n <= 0 || h <= 0 || w <= 0) return grid_png(path, NULL, n, h, w, 1, scale, 2);
    const float **img = lk_malloc(2 * (size_t)n * sizeof *img);
    if (!img) return lk_last_status();
    for (int i = 0; i < n; i++) {
        img[i] = originals + (size_t)i * (size_t)h * (size_t)w;
        img[n + i] = recons + (size_t)i * (size_t)h * (size_t)w;
    }
    lk_status st = grid_png(path, img, 2 * n, h, w, n, scale, 2);
    lk_free((void *)img);
    return st;
}

lk_status lk_image_recon_png_labeled(const char *path, const float *originals, const float *recons, int n, int h,
                                     int w, int scale) {
    if (!originals || !recons)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "reconstruction grid %s: images are NULL", path ? path : "");
    if (n <= 0 || h <= 0 || w <= 0) return grid_png(path, NULL, n, h, w, 1, scale, 2);
    const float **img = lk_malloc(2 * (size_t)n * sizeof *img);
    if (!img) return lk_last_status();
    for (int i = 0; i < n; i++) {
        img[i] = originals + (size_t)i * (size_t)h * (size_t)w;
        img[n + i] = recons + (size_t)i * (size_t)h * (size_t)w;
    }
    static const char *const labels[] = {"input", "reconstruction"};
    lk_status st = grid_png_labeled(path, img, 2 * n, h, w, n, scale, 2, labels);
    lk_free((void *)img);
    return st;
}
