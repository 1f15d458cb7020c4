/* A test policy in C that mirrors a Lua policy line by line (tests/plugins.rs,
 * `a_lua_policy_and_its_c_mirror_decide_the_same`): the actions of ABI 1.2 a
 * digits MLP can take, decided from the event's step, phase, micro-batch,
 * precision and offload. */
#include <stdlib.h>

#include "taper_plugin.h"

static TaperStatus create(TaperStr config, void **state, TaperErrorBuf *err) {
    (void)config;
    (void)err;
    *state = NULL;
    return TAPER_STATUS_OK;
}

static void destroy(void *state) { (void)state; }

static TaperStatus on_oom(void *state, const TaperOomEvent *ev, TaperOomAction *action,
                          TaperErrorBuf *err) {
    (void)state;
    (void)err;
    if (ev->step == 13 && !ev->offload) {
        action->action = TAPER_ACTION_OFFLOAD;
    } else if (ev->phase == TAPER_PHASE_EVAL) {
        action->action = TAPER_ACTION_SPLIT;
        action->micro_batch = ev->micro_batch / 4 > 0 ? ev->micro_batch / 4 : 1;
    } else if (ev->phase == TAPER_PHASE_UPLOAD) {
        action->action = TAPER_ACTION_RETRY;
    } else if (ev->phase == TAPER_PHASE_OPTIMIZER && ev->precision == TAPER_PRECISION_F32) {
        action->action = TAPER_ACTION_PRECISION;
        action->precision = TAPER_PRECISION_BF16;
    } else if (ev->phase == TAPER_PHASE_ACCUMULATE) {
        action->action = TAPER_ACTION_SKIP;
    } else if (ev->micro_batch > 16) {
        action->action = TAPER_ACTION_SPLIT;
        action->micro_batch = ev->micro_batch - 8;
    } else if (ev->attempt > 3) {
        action->action = TAPER_ACTION_STOP;
    } else {
        action->action = TAPER_ACTION_DEFAULT;
    }
    return TAPER_STATUS_OK;
}

static const TaperDescriptor DESCRIPTOR = {
    .abi_version = TAPER_ABI_VERSION,
    .size = sizeof(TaperDescriptor),
    .name = "mirror",
    .version = "1.2.0",
    .kinds = TAPER_KIND_OOM_POLICY,
    .create = create,
    .destroy = destroy,
    .on_oom = on_oom,
};

const TaperDescriptor *taper_plugin_v1(void) { return &DESCRIPTOR; }
