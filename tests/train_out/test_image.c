/* train_out: PNG grids decoded back by Debian's libstb (stb_image) and, when
 * present, by PIL under /usr/bin/python3: size, every pixel, separators. */
#include <stb/stb_image.h>

#include "out_test.h"

static unsigned char expect_byte(float v) {
    if (!(v > 0)) return 0;
    if (v >= 1) return 255;
    return (unsigned char)lrintf(v * 255.0f);
}

static void grid_pixels(void) {
    char root[256], path[512];
    out_tmpdir(root, sizeof root, "img");
    snprintf(path, sizeof path, "%s/grid.png", root);
    enum { N = 5, H = 4, W = 3, COLS = 3, S = 2, PAD = 1 };
    float img[N * H * W];
    for (int i = 0; i < N * H * W; i++) img[i] = (float)(i - 3) / 50.0f; /* negatives and > 1 too */
    img[7] = NAN;
    CHECK_OK(lk_image_grid_png(path, img, N, H, W, COLS, S, PAD));
    int w = 0, h = 0, c = 0;
    unsigned char *px = stbi_load(path, &w, &h, &c, 0);
    CHECK(px != NULL);
    if (!px) return;
    CHECK(c == 1);
    CHECK(w == PAD + COLS * (W * S + PAD) && h == PAD + 2 * (H * S + PAD));
    int bad = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int cx = (x - PAD) / (W * S + PAD), ox = (x - PAD) % (W * S + PAD);
            int cy = (y - PAD) / (H * S + PAD), oy = (y - PAD) % (H * S + PAD);
            int i = cy * COLS + cx;
            int inside = x >= PAD && y >= PAD && ox < W * S && oy < H * S && i < N;
            unsigned char want = inside ? expect_byte(img[(i * H + oy / S) * W + ox / S]) : 128;
            if (px[y * w + x] != want && bad++ < 5) fprintf(stderr, "pixel (%d, %d): %d, expected %d\n", x, y, px[y * w + x], want);
        }
    CHECK(bad == 0);
    stbi_image_free(px);

    /* PIL, if /usr/bin/python3 has it: same size and the same corner pixels */
    if (system("/usr/bin/python3 -c 'import PIL' >/dev/null 2>&1") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c \"from PIL import Image; im = Image.open('%s'); "
                 "assert im.mode == 'L' and im.size == (22, 19), (im.mode, im.size); "
                 "assert im.getpixel((0, 0)) == 128 and im.getpixel((1, 1)) == 0 and im.getpixel((13, 17)) == 255\"",
                 path);
        CHECK_MSG(system(cmd) == 0, "PIL disagrees: %s", cmd);
    } else {
        printf("skipped PIL check: not importable\n");
    }
    out_rm_rf(root);
}

static void recon_grid(void) {
    char root[256], path[512];
    out_tmpdir(root, sizeof root, "recon");
    snprintf(path, sizeof path, "%s/reconstructions.png", root);
    enum { N = 6, H = 28, W = 28 };
    static float orig[N * H * W], rec[N * H * W];
    for (int i = 0; i < N; i++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                float dx = (float)x - 13.5f, dy = (float)y - 13.5f, r = sqrtf(dx * dx + dy * dy);
                float v = r < 4.0f + 1.5f * (float)i ? 1.0f : 0.0f;
                orig[(i * H + y) * W + x] = v;
                rec[(i * H + y) * W + x] = 0.15f + 0.7f * v; /* a blurry, washed-out copy */
            }
    CHECK_OK(lk_image_recon_png(path, orig, rec, N, H, W, 2));
    int w = 0, h = 0, c = 0;
    unsigned char *px = stbi_load(path, &w, &h, &c, 1);
    CHECK(px != NULL);
    if (!px) return;
    CHECK(w == 2 + N * (W * 2 + 2) && h == 2 + 2 * (H * 2 + 2));
    /* centre of the first original is white; the same spot of its reconstruction is 0.85 */
    CHECK(px[(2 + 28) * w + 2 + 28] == 255);
    CHECK(px[(2 + 58 + 28) * w + 2 + 28] == expect_byte(0.85f));
    CHECK(px[(2 + 56) * w + 10] == 128); /* the separator between the rows */
    stbi_image_free(px);
    if (getenv("LK_OUT_KEEP")) printf("kept %s\n", path);
    else out_rm_rf(root);
}

/* Issue 48: the autoencoder's picture names its rows: a band above each
 * with "input" / "reconstruction" in black on gray, the images below. */
static void recon_grid_labeled(void) {
    char root[256], path[512];
    out_tmpdir(root, sizeof root, "reconl");
    snprintf(path, sizeof path, "%s/reconstructions.png", root);
    enum { N = 8, H = 28, W = 28, S = 3 };
    static float orig[N * H * W], rec[N * H * W];
    for (int i = 0; i < N * H * W; i++) orig[i] = 1.0f, rec[i] = 0.5f;
    CHECK_OK(lk_image_recon_png_labeled(path, orig, rec, N, H, W, S));
    int w = 0, h = 0, c = 0;
    unsigned char *px = stbi_load(path, &w, &h, &c, 1);
    CHECK(px != NULL);
    if (!px) return;
    int band = 7 * S + 2, row = band + H * S + 2;
    CHECK(w == 2 + N * (W * S + 2) && h == 2 + 2 * row);
    int black[2] = {0, 0};
    for (int r = 0; r < 2; r++) /* the label's pixels, in its band: "reconstruction" is the longer */
        for (int y = 2 + r * row; y < 2 + r * row + 7 * S; y++)
            for (int x = 0; x < w; x++) black[r] += px[y * w + x] == 0;
    CHECK_MSG(black[0] > 20 && black[1] > 2 * black[0], "label pixels: %d, %d", black[0], black[1]);
    CHECK(px[(2 + band) * w + 2] == 255);                    /* the first original starts below its band */
    CHECK(px[(2 + row + band) * w + 2] == expect_byte(0.5f)); /* and its reconstruction below the second */
    stbi_image_free(px);
    out_rm_rf(root);
}

static void bad_input(void) {
    float x[4] = {0};
    CHECK_ERR(lk_image_grid_png("/tmp/x.png", x, 0, 2, 2, 1, 1, 1), LK_STATUS_INVALID_ARGUMENT, "n=0");
    CHECK_ERR(lk_image_grid_png("/tmp/x.png", x, 1, 2, 2, 1, 0, 1), LK_STATUS_INVALID_ARGUMENT, "scale=0");
    CHECK_ERR(lk_image_grid_png("/tmp/x.png", NULL, 1, 2, 2, 1, 1, 1), LK_STATUS_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(lk_image_grid_png("/tmp/x.png", x, 1, 40000, 1, 1, 1, 1), LK_STATUS_INVALID_ARGUMENT, "at most");
    CHECK_ERR(lk_image_grid_png("/proc/nope/x.png", x, 1, 2, 2, 1, 1, 1), LK_STATUS_IO, "/proc/nope/x.png");
    CHECK_ERR(lk_image_recon_png("/tmp/x.png", x, NULL, 1, 2, 2, 1), LK_STATUS_INVALID_ARGUMENT, "NULL");
}

LK_TEST_MAIN(LK_TEST_CASE(grid_pixels), LK_TEST_CASE(recon_grid), LK_TEST_CASE(recon_grid_labeled), LK_TEST_CASE(bad_input))
