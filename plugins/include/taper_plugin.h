/* taper strategy plugins: the C ABI, version 1.
 *
 * The same ABI as the Rust crate in plugins/abi (crate `taper-plugin`);
 * tests/plugins.rs compiles a C program against this header and checks that
 * every size and field offset matches the Rust definitions.
 *
 * A plugin is a shared library that exports
 *
 *     const TaperDescriptor *taper_plugin_v1(void);
 *
 * returning a pointer to static data. The descriptor starts with the ABI
 * version and its own size; later versions only append fields. Every call
 * returns a TaperStatus; on failure it writes a UTF-8 message (at most
 * err->cap bytes, not NUL-terminated) into err and sets err->len.
 *
 * The host serializes calls into one plugin instance (the state `create`
 * returned) but may make them from different threads. Libraries are never
 * unloaded.
 */
#ifndef TAPER_PLUGIN_H
#define TAPER_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TAPER_ABI_VERSION 1u

typedef int32_t TaperStatus;
#define TAPER_STATUS_OK 0
#define TAPER_STATUS_ERROR 1
#define TAPER_STATUS_PANIC 2

/* Strategy kinds: bits of TaperDescriptor.kinds. */
#define TAPER_KIND_OOM_POLICY 1u
#define TAPER_KIND_SCHEDULE 2u
#define TAPER_KIND_TRANSFORM 4u

/* A borrowed UTF-8 string, not NUL-terminated. */
typedef struct TaperStr {
    const uint8_t *ptr;
    size_t len;
} TaperStr;

/* A host-owned buffer for an error message. */
typedef struct TaperErrorBuf {
    uint8_t *ptr;
    size_t cap;
    size_t len;
} TaperErrorBuf;

#define TAPER_PHASE_FORWARD 0u
#define TAPER_PHASE_BACKWARD 1u
#define TAPER_PHASE_OPTIMIZER 2u
/* Since ABI 1.1 (a plugin built earlier sees these values too: treat an
 * unknown phase like any other). */
#define TAPER_PHASE_UPLOAD 3u     /* the batch copied to the device */
#define TAPER_PHASE_ACCUMULATE 4u /* gradients added up, loss read back */
#define TAPER_PHASE_EVAL 5u       /* evaluation: no training state involved */
#define TAPER_CAUSE_DEVICE 0u
#define TAPER_CAUSE_BUDGET 1u
#define TAPER_CAUSE_INJECTED 2u

typedef struct TaperOomEvent {
    uint32_t phase;
    uint32_t cause;
    uint64_t step;          /* the step that failed, 1-based */
    uint64_t epoch;
    uint64_t batch_size;
    uint64_t micro_batch;   /* the micro-batch that ran out of memory */
    uint32_t attempt;       /* 1 for the first attempt at this step */
    uint32_t _pad;
    uint64_t memory_used;   /* host heap bytes (counting allocator) */
    uint64_t memory_peak;
    uint64_t memory_limit;  /* 0 when there is no budget */
    /* Appended in ABI 1.1. The host always passes the whole event; a plugin
     * built against ABI 1.0 reads the fields above only. */
    uint64_t requested;     /* bytes the failed allocation asked for, 0 unknown */
    uint64_t device_used;   /* on a GPU: the driver's figures; 0 on the CPU */
    uint64_t device_free;
    uint64_t device_total;
    uint32_t precision;     /* TAPER_PRECISION_*: what forward/backward ran in */
    uint32_t _pad2;
    /* Appended in ABI 1.2. */
    uint32_t recompute;     /* every how many blocks the backward recomputed, 0 none */
    uint32_t offload;       /* 1 when AdamW's moments were offloaded */
} TaperOomEvent;

#define TAPER_PRECISION_UNSET 0u
#define TAPER_PRECISION_F32 1u
#define TAPER_PRECISION_BF16 2u
#define TAPER_PRECISION_F16 3u

#define TAPER_ACTION_DEFAULT 0u /* let the host decide: halve the micro-batch */
#define TAPER_ACTION_SPLIT 1u   /* micro_batch = new size, 0 for half */
#define TAPER_ACTION_RETRY 2u
#define TAPER_ACTION_SKIP 3u
#define TAPER_ACTION_STOP 4u
#define TAPER_ACTION_PRECISION 5u /* ABI 1.1: precision = TAPER_PRECISION_*, then retry */
#define TAPER_ACTION_RECOMPUTE 6u /* ABI 1.2: recompute every `every` blocks (0: 1), then retry */
#define TAPER_ACTION_OFFLOAD 7u   /* ABI 1.2: offload AdamW's moments, then retry */

/* The host zeroes the whole action before the call; a plugin built against
 * ABI 1.0 writes the first two fields only. */
typedef struct TaperOomAction {
    uint32_t action;
    uint32_t _pad;
    uint64_t micro_batch;
    /* Appended in ABI 1.1. */
    uint32_t precision;     /* with TAPER_ACTION_PRECISION */
    uint32_t _pad2;
    /* Appended in ABI 1.2. */
    uint64_t every;         /* with TAPER_ACTION_RECOMPUTE */
} TaperOomAction;

/* After each successful step. */
typedef struct TaperStepInfo {
    uint64_t step;
    uint64_t micro_batch;
    uint64_t batch_size;
    uint64_t clean_steps;   /* successful steps since the last OOM */
    /* Appended in ABI 1.2. */
    uint64_t peak;          /* the step's measured heap peak, 0 when not counted */
    uint64_t limit;         /* the memory budget, 0 when none */
} TaperStepInfo;

/* A step's plan. Unset: lr NaN, sizes 0. */
typedef struct TaperPlan {
    double lr;
    uint64_t micro_batch;
    uint64_t batch_size;
} TaperPlan;

#define TAPER_DTYPE_F32 0u
#define TAPER_DTYPE_U32 1u
#define TAPER_MAX_DIMS 6

/* A host-owned CPU tensor, row-major and contiguous. Transforms may change
 * values in place, not shapes. */
typedef struct TaperTensorView {
    void *data;
    uint32_t dtype;
    uint32_t ndim;
    uint64_t shape[TAPER_MAX_DIMS];
} TaperTensorView;

typedef struct TaperBatchView {
    TaperTensorView x;
    TaperTensorView y;
    const uint64_t *indices; /* the samples, `size` of them */
    uint64_t size;
    uint64_t epoch;
} TaperBatchView;

typedef TaperStatus (*TaperCreateFn)(TaperStr config_json, void **state, TaperErrorBuf *err);
typedef void (*TaperDestroyFn)(void *state);
typedef TaperStatus (*TaperOnOomFn)(void *state, const TaperOomEvent *event,
                                    TaperOomAction *action, TaperErrorBuf *err);
typedef TaperStatus (*TaperOnStepFn)(void *state, const TaperStepInfo *info, TaperPlan *plan,
                                     TaperErrorBuf *err);
typedef TaperStatus (*TaperScheduleFn)(void *state, uint64_t step, uint64_t epoch,
                                       TaperPlan *plan, TaperErrorBuf *err);
typedef TaperStatus (*TaperTransformFn)(void *state, TaperBatchView *batch, TaperErrorBuf *err);

typedef struct TaperDescriptor {
    uint32_t abi_version;   /* TAPER_ABI_VERSION */
    uint32_t size;          /* sizeof(TaperDescriptor) */
    const char *name;       /* NUL-terminated */
    const char *version;
    uint32_t kinds;         /* TAPER_KIND_* bits */
    uint32_t _pad;
    TaperCreateFn create;
    TaperDestroyFn destroy;
    TaperOnOomFn on_oom;         /* TAPER_KIND_OOM_POLICY */
    TaperOnStepFn on_step;       /* TAPER_KIND_OOM_POLICY, optional */
    TaperScheduleFn schedule;    /* TAPER_KIND_SCHEDULE */
    TaperTransformFn transform;  /* TAPER_KIND_TRANSFORM */
} TaperDescriptor;

typedef const TaperDescriptor *(*TaperEntryFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TAPER_PLUGIN_H */
