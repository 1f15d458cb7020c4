/* A taper OOM policy written in C, using only plugins/include/taper_plugin.h.
 *
 * On an OOM it halves the micro-batch, but not below `floor` samples
 * (option, default 1): at the floor it stops the run. Build it with
 *
 *     cc -shared -fPIC -O2 -I plugins/include plugins/c-policy/policy.c \
 *        -o target/libtaper_c_policy.so
 *
 * and load it from a recipe:
 *
 *     local p = taper.plugin.load("target/libtaper_c_policy.so", { floor = 4 })
 *     local run = taper.run{ ..., on_oom = p }
 */
#include <stdlib.h>
#include <string.h>

#include "taper_plugin.h"

typedef struct {
    unsigned long long floor;
    unsigned long long events;
} Policy;

static void fail(TaperErrorBuf *err, const char *msg) {
    size_t n = strlen(msg);
    if (n > err->cap) n = err->cap;
    memcpy(err->ptr, msg, n);
    err->len = n;
}

/* The options arrive as JSON; this policy reads one integer, `floor`. */
static TaperStatus create(TaperStr config, void **state, TaperErrorBuf *err) {
    Policy *p = calloc(1, sizeof *p);
    if (!p) {
        fail(err, "out of memory");
        return TAPER_STATUS_ERROR;
    }
    p->floor = 1;
    char buf[256];
    size_t n = config.len < sizeof buf - 1 ? config.len : sizeof buf - 1;
    memcpy(buf, config.ptr, n);
    buf[n] = 0;
    const char *f = strstr(buf, "\"floor\"");
    if (f) {
        f = strchr(f, ':');
        long v = f ? strtol(f + 1, NULL, 10) : 0;
        if (v < 1) {
            free(p);
            fail(err, "option `floor` must be an integer >= 1");
            return TAPER_STATUS_ERROR;
        }
        p->floor = (unsigned long long)v;
    }
    *state = p;
    return TAPER_STATUS_OK;
}

static void destroy(void *state) { free(state); }

static TaperStatus on_oom(void *state, const TaperOomEvent *ev, TaperOomAction *action,
                          TaperErrorBuf *err) {
    (void)err;
    Policy *p = state;
    p->events++;
    unsigned long long half = ev->micro_batch / 2;
    if (half < p->floor) {
        action->action = TAPER_ACTION_STOP;
    } else {
        action->action = TAPER_ACTION_SPLIT;
        action->micro_batch = half;
    }
    return TAPER_STATUS_OK;
}

static const TaperDescriptor DESCRIPTOR = {
    .abi_version = TAPER_ABI_VERSION,
    .size = sizeof(TaperDescriptor),
    .name = "c-policy",
    .version = "0.1.0",
    .kinds = TAPER_KIND_OOM_POLICY,
    .create = create,
    .destroy = destroy,
    .on_oom = on_oom,
};

const TaperDescriptor *taper_plugin_v1(void) { return &DESCRIPTOR; }
