/* The resnet: torchvision's ResNet (models/resnet.py) with its module names,
 * so a state dict loads into torchvision.models.resnet18 (with the stem
 * adapted the same way) by name, and the CIFAR family of He et al. (2016).
 *
 *   ResNet
 *   ├ conv1    Conv2d cin -> W: 7x7 stride 2 pad 3 (imagenet stem) or
 *   │          3x3 stride 1 pad 1 (small stem), no bias
 *   ├ bn1      BatchNorm2d W
 *   ├ relu
 *   ├ maxpool  MaxPool2d 3x3 stride 2 pad 1 (imagenet stem only)
 *   ├ layer1 .. layer4 (CIFAR family: layer1 .. layer3), each a Sequential
 *   │          of blocks "0", "1", ...; the first block of a stage strides
 *   │          (1 for layer1, 2 after) and has a shortcut `downsample`
 *   │          (1x1 conv stride s + BatchNorm: Sequential "0", "1") when
 *   │          the stride or the width changes, else the identity
 *   │   BasicBlock  conv1 3x3 stride s, bn1, relu, conv2 3x3, bn2,
 *   │               (downsample); relu(bn2(conv2(relu(bn1(conv1 x)))) + sc(x))
 *   │   Bottleneck  conv1 1x1, bn1, conv2 3x3 stride s, bn2, conv3 1x1 to 4x
 *   │               the width, bn3, relu, (downsample) (torchvision's v1.5:
 *   │               the stride on the 3x3)
 *   ├ avgpool  AdaptiveAvgPool2d (1, 1), then flatten
 *   └ fc       Linear (final width) -> num_classes
 *
 * Depths: 18 and 34 (basic blocks [2,2,2,2] and [3,4,6,3]) and 50
 * (bottlenecks [3,4,6,3]) as torchvision's, stage widths W, 2W, 4W, 8W
 * (W = 64 by default); 20, 32, 44, 56, 110 as the CIFAR family: 3 stages of
 * (depth - 2) / 6 basic blocks, widths W, 2W, 4W (W = 16 by default).
 *
 * The stem: `stem: auto` takes the small one (3x3 stride 1, no max-pool:
 * what the CIFAR ResNets use and how torchvision's resnet18 is adapted to
 * 32x32 inputs) for image_size <= 64, torchvision's 7x7/2 + max-pool above;
 * the CIFAR family always has its small stem.
 *
 * Init as torchvision's: every conv kaiming_normal(fan_out, relu), every
 * BatchNorm weight 1 and bias 0, fc as nn.Linear's default; with
 * zero_init_residual the last BatchNorm of each block (bn2 / bn3) starts
 * with weight 0, so each block begins as its shortcut.
 *
 * The forward is a sequence of blocks a pipeline can cut
 * (lk_model_blocks): "stem" (a view over conv1, bn1, relu, maxpool; it
 * also brings flat rows to images), each residual block by its dotted name
 * ("layer1.0", ...), "head" (a view over avgpool and fc). The residual
 * blocks are the model's checkpoint units. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

static const lk_model_arg resnet_args[] = {
    {"depth", LK_ARG_INT, "18", "18, 34 (basic blocks), 50 (bottlenecks) as torchvision's; 20, 32, 44, 56, 110 (CIFAR family)"},
    {"width", LK_ARG_STRING, "auto", "channels of the first stage, doubled per stage (auto: 64 for 18/34/50, 16 for the CIFAR family)"},
    {"in_channels", LK_ARG_INT, "3", "input image channels"},
    {"image_size", LK_ARG_INT, "32", "input height = width"},
    {"num_classes", LK_ARG_INT, "10", "output classes"},
    {"stem", LK_ARG_STRING, "auto", "auto (small for image_size <= 64), small (3x3 stride 1, no max-pool), imagenet (7x7 stride 2 + max-pool)"},
    {"zero_init_residual", LK_ARG_BOOL, "false", "start each block's last BatchNorm weight at 0 (torchvision's option)"},
};

typedef struct {
    int64_t in_channels, image_size, width, num_classes;
    int n_stages;
    int blocks[4];
    bool bottleneck, imagenet_stem, zero_init_residual;
} resnet_cfg;

/* The smallest image the stem and the stages take: each stride-2 step needs
 * at least 2 pixels to halve, so the last stage still sees a real map. */
static int64_t min_image_size(const resnet_cfg *c) {
    int halvings = (c->n_stages - 1) + (c->imagenet_stem ? 2 : 0);
    return (int64_t)1 << halvings;
}

/* ---- init ------------------------------------------------------------------------------ */

/* torchvision: kaiming_normal_(weight, mode="fan_out", nonlinearity="relu") */
static lk_status conv_reset(lk_layer *self, lk_rng *rng) {
    lk_tensor *w = lk_layer_param(self, 0);
    int64_t fan_out = 0;
    LK_TRY(lk_init_fans(w, NULL, &fan_out));
    /* N(0, sqrt(2 / fan_out)) from the bulk sequence (resnet50 has 23 M
     * conv weights: one Box-Muller pair per two values is slow) */
    return lk_init_normal_bulk(w, rng, 0.0, sqrt(2.0 / (double)fan_out));
}

/* zero_init_residual: a block's last BatchNorm starts at weight 0, bias 0;
 * its running statistics as any BatchNorm's (mean 0, var 1, count 0). */
static lk_status bn_zero_reset(lk_layer *self, lk_rng *rng) {
    (void)rng;
    LK_TRY(lk_init_zeros(lk_layer_param(self, 0)));
    LK_TRY(lk_init_zeros(lk_layer_param(self, 1)));
    LK_TRY(lk_tensor_fill(lk_layer_buffer(self, 0), 0.0));
    LK_TRY(lk_tensor_fill(lk_layer_buffer(self, 1), 1.0));
    return lk_tensor_fill(lk_layer_buffer(self, 2), 0.0);
}

static lk_layer *conv(int64_t cin, int64_t cout, int k, int stride) {
    lk_conv2d_params p = {{stride, stride}, {k / 2, k / 2}, {1, 1}, 1};
    lk_layer *l = lk_conv2d_create(cin, cout, k, k, p, false, NULL);
    if (l) l->reset = conv_reset;
    return l;
}

static lk_layer *bn(int64_t c) { return lk_batch_norm2d_create(c, 1e-5f, 0.1f, true, true); }

/* ---- blocks ---------------------------------------------------------------------------- */

/* the block's child called `name`, or NULL */
static lk_layer *child(lk_layer *l, const char *name) {
    for (int i = 0; i < l->n_children; i++)
        if (!strcmp(l->children[i].name, name)) return l->children[i].layer;
    return NULL;
}

static lk_tensor *fwd(lk_layer *self, const char *name, lk_tensor *x) { return x ? lk_layer_forward(child(self, name), x) : NULL; }

/* relu(bn2(conv2(relu(bn1(conv1 x))))) + shortcut(x)); bn1 applies its
 * ReLU itself (lk_layer_batch_norm_fuse_relu in block_create) and the add
 * and the last ReLU are one op (lk_add_relu): the block's "relu" child is
 * kept for torchvision's module names, not called */
static lk_tensor *basic_forward(lk_layer *self, lk_tensor *x) {
    lk_tensor *out = fwd(self, "bn1", fwd(self, "conv1", x));
    out = fwd(self, "bn2", fwd(self, "conv2", out));
    lk_layer *ds = child(self, "downsample");
    lk_tensor *sc = ds ? lk_layer_forward(ds, x) : x;
    /* the add and its ReLU as one op (same bits as the block's "relu" after lk_add) */
    return out && sc ? lk_add_relu(out, sc) : NULL;
}

/* relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1 x)))))) + shortcut(x)); bn1
 * and bn2 apply their ReLUs themselves (as in basic_forward) */
static lk_tensor *bottleneck_forward(lk_layer *self, lk_tensor *x) {
    lk_tensor *out = fwd(self, "bn1", fwd(self, "conv1", x));
    out = fwd(self, "bn2", fwd(self, "conv2", out));
    out = fwd(self, "bn3", fwd(self, "conv3", out));
    lk_layer *ds = child(self, "downsample");
    lk_tensor *sc = ds ? lk_layer_forward(ds, x) : x;
    return out && sc ? lk_add_relu(out, sc) : NULL;
}

/* One residual block from cin channels at `stride`; planes is the block's
 * inner width (its output: planes, or 4 x planes for a bottleneck). */
static lk_layer *block_create(const resnet_cfg *c, int64_t cin, int64_t planes, int stride) {
    int64_t cout = c->bottleneck ? 4 * planes : planes;
    lk_layer *blk = c->bottleneck ? lk_layer_create("Bottleneck", bottleneck_forward, NULL, NULL)
                                  : lk_layer_create("BasicBlock", basic_forward, NULL, NULL);
    if (!blk) return NULL;
    lk_status st;
    if (c->bottleneck) {
        st = lk_layer_add_child(blk, "conv1", conv(cin, planes, 1, 1));
        if (!st) st = lk_layer_add_child(blk, "bn1", bn(planes));
        if (!st) st = lk_layer_add_child(blk, "conv2", conv(planes, planes, 3, stride));
        if (!st) st = lk_layer_add_child(blk, "bn2", bn(planes));
        if (!st) st = lk_layer_add_child(blk, "conv3", conv(planes, cout, 1, 1));
        if (!st) st = lk_layer_add_child(blk, "bn3", bn(cout));
        if (!st) st = lk_layer_add_child(blk, "relu", lk_relu_create());
    } else {
        st = lk_layer_add_child(blk, "conv1", conv(cin, planes, 3, stride));
        if (!st) st = lk_layer_add_child(blk, "bn1", bn(planes));
        if (!st) st = lk_layer_add_child(blk, "relu", lk_relu_create());
        if (!st) st = lk_layer_add_child(blk, "conv2", conv(planes, planes, 3, 1));
        if (!st) st = lk_layer_add_child(blk, "bn2", bn(planes));
    }
    /* batch norm + ReLU in one op (the forward functions above skip the ReLU) */
    if (!st) st = lk_layer_batch_norm_fuse_relu(child(blk, "bn1"), NULL);
    if (!st && c->bottleneck) st = lk_layer_batch_norm_fuse_relu(child(blk, "bn2"), NULL);
    if (!st && c->zero_init_residual) child(blk, c->bottleneck ? "bn3" : "bn2")->reset = bn_zero_reset;
    if (!st && (stride != 1 || cin != cout)) {
        lk_layer *ds = lk_sequential_create(2, (lk_layer *[]){conv(cin, cout, 1, stride), bn(cout)});
        st = lk_layer_add_child(blk, "downsample", ds);
    }
    if (st) {
        lk_layer_free(blk);
        return NULL;
    }
    blk->checkpoint_unit = true; /* what activation checkpointing recomputes */
    return blk;
}

/* ---- the stem and head views ----------------------------------------------------------- */

/* images [N, C, S, S] (or flat rows [N, C*S*S]) -> conv1, bn1, relu, (maxpool) */
static lk_tensor *stem_forward(lk_layer *self, lk_tensor *x) {
    const resnet_cfg *c = self->impl;
    char s[128];
    if (x->ndim == 2 && x->shape[1] == c->in_channels * c->image_size * c->image_size)
        x = lk_reshape(x, LK_SHAPE(x->shape[0], c->in_channels, c->image_size, c->image_size));
    int64_t least = min_image_size(c);
    if (!x || x->ndim != 4 || x->shape[1] != c->in_channels || x->shape[2] < least || x->shape[3] < least)
        return x ? lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "model resnet: expected images [N, %lld, H, W] with H, W >= %lld (%s stem, %d stages) or "
                            "flat rows [N, %lld], got %s",
                            (long long)c->in_channels, (long long)least, c->imagenet_stem ? "imagenet" : "small",
                            c->n_stages, (long long)(c->in_channels * c->image_size * c->image_size),
                            lk_shape_str(x, s, sizeof s)),
                   NULL : NULL;
    for (int i = 0; i < self->n_children && x; i++) x = lk_layer_forward(self->children[i].layer, x);
    return x;
}

/* [N, C, h, w] -> fc(flatten(avgpool x)) [N, num_classes] */
static lk_tensor *head_forward(lk_layer *self, lk_tensor *x) {
    x = lk_layer_forward(lk_layer_child(self, 0), x);
    x = x ? lk_reshape(x, LK_SHAPE(x->shape[0], -1)) : NULL;
    return x ? lk_layer_forward(lk_layer_child(self, 1), x) : NULL;
}

/* ---- the builder ----------------------------------------------------------------------- */

static lk_status check_args(const lk_model_args *a, resnet_cfg *c) {
    int64_t depth = lk_model_args_int(a, "depth");
    static const int tv_blocks[3][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}, {3, 4, 6, 3}};
    int tv = depth == 18 ? 0 : depth == 34 ? 1 : depth == 50 ? 2 : -1;
    bool cifar = depth == 20 || depth == 32 || depth == 44 || depth == 56 || depth == 110;
    if (tv < 0 && !cifar)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model resnet: depth = %lld: expected 18, 34 or 50 (torchvision's) or 20, 32, 44, 56, 110 "
                        "(the CIFAR family, 6n+2)",
                        (long long)depth);
    c->bottleneck = depth == 50;
    c->n_stages = cifar ? 3 : 4;
    for (int i = 0; i < c->n_stages; i++) c->blocks[i] = cifar ? (int)(depth - 2) / 6 : tv_blocks[tv][i];
    const char *w = lk_model_args_string(a, "width");
    char *end = NULL;
    c->width = !strcmp(w, "auto") ? (cifar ? 16 : 64) : strtoll(w, &end, 10);
    if (end && (end == w || *end || c->width < 1 || c->width > 65536))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model resnet: width = '%s': expected auto or an integer in [1, 65536]", w);
    c->in_channels = lk_model_args_int(a, "in_channels");
    c->image_size = lk_model_args_int(a, "image_size");
    c->num_classes = lk_model_args_int(a, "num_classes");
    static const char *const pos[] = {"in_channels", "image_size", "num_classes"};
    int64_t vals[] = {c->in_channels, c->image_size, c->num_classes};
    for (int i = 0; i < 3; i++)
        if (vals[i] > 65536)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model resnet: %s = %lld: expected an integer in [1, 65536]", pos[i],
                            (long long)vals[i]);
    const char *stem = lk_model_args_string(a, "stem");
    if (strcmp(stem, "auto") && strcmp(stem, "small") && strcmp(stem, "imagenet"))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model resnet: stem = '%s': expected auto, small or imagenet", stem);
    if (cifar && !strcmp(stem, "imagenet"))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model resnet: stem = imagenet with depth %lld: the CIFAR family (20..110) has its 3x3 stem "
                        "(use stem: auto or small, or depth 18/34/50)",
                        (long long)depth);
    c->imagenet_stem = !cifar && (!strcmp(stem, "imagenet") || (!strcmp(stem, "auto") && c->image_size > 64));
    c->zero_init_residual = lk_model_args_bool(a, "zero_init_residual");
    int64_t least = min_image_size(c);
    if (c->image_size < least)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model resnet: image_size = %lld is too small for the %s stem and %d stages (it halves the "
                        "image %d times): expected image_size >= %lld%s",
                        (long long)c->image_size, c->imagenet_stem ? "imagenet" : "small", c->n_stages,
                        c->n_stages - 1 + (c->imagenet_stem ? 2 : 0), (long long)least,
                        c->imagenet_stem ? " (or stem: small)" : "");
    return LK_STATUS_OK;
}

static lk_status build_resnet(const lk_model_args *a, uint64_t seed, lk_layer **out) {
    (void)seed; /* lk_model_create draws every parameter with lk_layer_reset_parameters */
    resnet_cfg *c = lk_calloc(1, sizeof *c), *cs = lk_calloc(1, sizeof *cs);
    lk_status st = c && cs ? check_args(a, c) : LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        lk_free(c);
        lk_free(cs);
        return st;
    }
    *cs = *c;
    lk_layer *m = lk__model_staged_create("ResNet", c);
    lk_layer *stem = lk_layer_create("ResNetStem", stem_forward, cs, NULL);
    lk_layer *head = lk_layer_create("ResNetHead", head_forward, NULL, NULL);
    if (!m || !stem || !head) {
        lk_layer_free(m), lk_layer_free(stem), lk_layer_free(head);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    int64_t W = c->width;
    lk_pool2d_params mp = {{3, 3}, {2, 2}, {1, 1}, true, false};
    st = lk_layer_add_child(m, "conv1", c->imagenet_stem ? conv(c->in_channels, W, 7, 2) : conv(c->in_channels, W, 3, 1));
    if (!st) st = lk_layer_add_child(m, "bn1", bn(W));
    if (!st) st = lk_layer_add_child(m, "relu", lk_relu_create());
    /* the stem's batch norm and ReLU in one op: its "relu" layer becomes the identity */
    if (!st) st = lk_layer_batch_norm_fuse_relu(lk_layer_get_child(m, "bn1"), lk_layer_get_child(m, "relu"));
    if (!st && c->imagenet_stem) st = lk_layer_add_child(m, "maxpool", lk_max_pool2d_create(mp));
    int64_t cin = W;
    for (int s = 0; !st && s < c->n_stages; s++) {
        lk_layer *stage = lk_sequential_create(0, NULL);
        char name[16];
        snprintf(name, sizeof name, "layer%d", s + 1);
        st = lk_layer_add_child(m, name, stage);
        int64_t planes = W << s;
        for (int b = 0; !st && b < c->blocks[s]; b++) {
            st = lk_sequential_append(stage, block_create(c, cin, planes, b == 0 && s > 0 ? 2 : 1));
            cin = c->bottleneck ? 4 * planes : planes;
        }
    }
    if (!st) st = lk_layer_add_child(m, "avgpool", lk_adaptive_avg_pool2d_create(1, 1));
    if (!st) st = lk_layer_add_child(m, "fc", lk_linear_create(cin, c->num_classes, true, NULL));
    /* the blocks: the stem and the head are views over the model's layers */
    static const char *const stem_parts[] = {"conv1", "bn1", "relu", "maxpool"};
    for (int i = 0; !st && i < (c->imagenet_stem ? 4 : 3); i++)
        st = lk_layer_add_child_ref(stem, stem_parts[i], lk_layer_get_child(m, stem_parts[i]));
    if (!st) st = lk_layer_add_child_ref(head, "avgpool", lk_layer_get_child(m, "avgpool"));
    if (!st) st = lk_layer_add_child_ref(head, "fc", lk_layer_get_child(m, "fc"));
    if (!st) st = lk__model_staged_add(m, "stem", stem, true);
    else lk_layer_free(stem);
    for (int s = 0; !st && s < c->n_stages; s++)
        for (int b = 0; !st && b < c->blocks[s]; b++) {
            char name[32];
            snprintf(name, sizeof name, "layer%d.%d", s + 1, b);
            st = lk__model_staged_add(m, name, lk_layer_get_child(m, name), false);
        }
    if (!st) st = lk__model_staged_add(m, "head", head, true);
    else lk_layer_free(head);
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

/* [in_channels, image_size, image_size] */
static lk_status resnet_input_shape(const lk_model_args *a, int *ndim, int64_t shape[3], char *why, size_t why_size) {
    int64_t c = lk_model_args_int(a, "in_channels"), s = lk_model_args_int(a, "image_size");
    *ndim = 3;
    shape[0] = c;
    shape[1] = shape[2] = s;
    snprintf(why, why_size, "in_channels %lld, image_size %lld", (long long)c, (long long)s);
    return LK_STATUS_OK;
}

const lk_model_info lk__model_resnet = {
    .name = "resnet",
    .help = "torchvision's ResNet (18/34/50) and the CIFAR ResNets (20/32/44/56/110): residual blocks with BatchNorm, "
            "global average pool, linear head: cross-entropy",
    .loss = LK_LOSS_CROSS_ENTROPY,
    .target_is_input = false,
    .args = resnet_args,
    .n_args = (int)(sizeof resnet_args / sizeof resnet_args[0]),
    .build = build_resnet,
    .input_shape = resnet_input_shape,
    .loss_fn = lk__loss_classification,
    .alias = "ResNet",
};
